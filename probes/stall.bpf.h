/* A message that reaches a request/response receiver (pgbench, a backend) in many pieces: a large result, streamed
 * by its sender in many sends and delivered as the receiver's window lets it. The receiver's socket keeps the last
 * piece's arrival (pp_sock.piece_ts) until the receiver answers, and each further piece accounts for the time
 * since it, once: [previous piece, this piece] is
 *   - send_blocked.<sender>: the previous piece left the receiver's window full (TCP: less than one segment of
 *     the window it advertised is left; AF_UNIX: the sender's buffer, which holds what the receiver has not read,
 *     half full or more), so the sender could not go on until the receiver read: a client not reading fast enough,
 *     the backend's ClientWrite wait (its send sleeping on a full send buffer, or its data queued behind a closed
 *     window). Charged to the sender, on the message's leg;
 *   - else the sender's own work between two of its sends (backend.execute producing more rows) up to
 *     the send that delivers this piece, and wire from there; a piece no send of the sender delivers (sent earlier,
 *     let go by an ACK or a retransmission) is wire, or a retransmission's wait, from the previous piece.
 * A hop's pieces: the later parts of a reply it relays are accounted here along their chain (relay.bpf.h); parts
 * measured where they happen (a reply's first, pgpool's parts between its round trips upstream) are on the path
 * through the hop's own stages, and only a piece's trip from its send is wire (as for a first piece).
 * Before, every piece delivered inside one send was counted from that send's start (overlapping spans: +127 % on
 * a 2 MB result to an 8 KB receive buffer) and the time between sends was in no stage (-21.5 % at full speed).
 * Part of pathprof.bpf.c (one object: every family shares its maps); included in order, not alone. */
#ifndef PATHPROF_STALL_BPF_H
#define PATHPROF_STALL_BPF_H

/* after a piece was queued on `sk`: can its sender send no more until the receiver reads? */
static __always_inline __u8 piece_fills_window(struct sock *sk)
{
	if (sk->sk_protocol == IPPROTO_TCP_NUM) {
#ifndef PP_NO_RDONLY_CAST
		struct tcp_sock *tp = kcast(sk, struct tcp_sock);
		__s32 left = (__s32)(tp->rcv_wup + tp->rcv_wnd - tp->rcv_nxt);   /* tcp_receive_window() */
		return left < (__s32)tp->inet_conn.icsk_ack.rcv_mss;
#else
		__s32 left = (__s32)(kread(sk, struct tcp_sock, rcv_wup) + kread(sk, struct tcp_sock, rcv_wnd) -
				     kread(sk, struct tcp_sock, rcv_nxt));
		return left < (__s32)kread(sk, struct tcp_sock, inet_conn.icsk_ack.rcv_mss);
#endif
	}
	if (sk->__sk_common.skc_family == AF_UNIX_NUM) {
		/* a unix stream's queued bytes are charged to the sender, which blocks at its sk_sndbuf */
		struct sock *peer = unix_peer(sk);
		if (!peer)
			return 0;
		return (__u32)peer->sk_wmem_alloc.refs.counter * 2 >= (__u32)peer->sk_sndbuf;
	}
	return 0;
}

/* who sends into s: learned from a piece delivered inside its sender's send; until then the far end of a direct
 * path (a backend answers pgbench, pgbench asks a backend) */
static __always_inline void piece_sender(struct pp_sock *s, __u8 *role, __u32 *hop)
{
	*role = s->peer_role ? s->peer_role : s->leg == PP_LEG_RESPONSE ? PP_ROLE_BACKEND : PP_ROLE_PGBENCH;
	*hop = s->peer_role ? s->peer_hop : 0;
}

/* the span of time [from, to] of a message into s during which its sender could not send */
static __always_inline void send_blocked(struct pp_sock *s, __u64 from, __u64 to, __u32 seq)
{
	__u8 role;
	__u32 hop;
	piece_sender(s, &role, &hop);
	struct pp_stage_key k = { .stage = PP_ST_SEND_BLOCKED, .role = role, .leg = s->leg, .hop = span_slot(role, hop) };
	stage_add(&k, to - from);
	trace_emit(PP_ST_SEND_BLOCKED, role, s->leg, span_slot(role, hop), from, to - from, seq);
	stat_inc(PP_STAT_PIECE_BLOCKED);
}

/* the sender t (a backend, pgbench), delivering a further piece inside its send: its own work between the previous
 * piece and this send */
static __always_inline void piece_sender_work(struct pp_sock *s, struct pp_task *t, __u64 prev, __u32 seq)
{
	if (t->send_ts <= prev)
		return;
	__u8 leg = t->role == PP_ROLE_BACKEND ? PP_LEG_SERVER : t->role == PP_ROLE_PGBENCH ? PP_LEG_CLIENT : s->leg;
	span(PP_ST_PROC, t->role, leg, t->hop, prev, t->send_ts - prev, seq);
}

/* A further piece of the message into s (a request/response receiver that has not answered since its first piece)
 * arrived at `now`: account for the time since the previous piece (see the top of this file). t: the running task
 * (the sender when the piece is delivered inside its send); tcp: the socket is TCP. A hop's pieces (pgpool forwards a
 * reply in parts, between its own round trips upstream) are on the path through the hop's own stages, as before:
 * only a piece's trip from its send is wire, never counted from before the previous piece. */
static __always_inline void piece_more(struct sock *sk, struct pp_sock *s, struct pp_task *t, __u64 ws, __u64 now,
				       __u32 seq, int tcp)
{
	__u64 prev = s->piece_ts;
	stat_inc(PP_STAT_PIECE_MORE);
	if (s->piece_full) {
		send_blocked(s, prev, now, seq);
		return;
	}
	if (t && !t->in_send && !tcp && sk->__sk_common.skc_family == AF_UNIX_NUM) {
		t->send_ts = now;             /* AF_UNIX: the send starts here (msg.bpf.h) */
		t->in_send = 1;
	}
	__u8 role;
	__u32 hop;
	piece_sender(s, &role, &hop);
	int in_send = t && sending(t, (__u64)sk);
	int by_hop = is_hop_role(in_send ? t->role : role);
	if (in_send && by_hop && t->consume_later == PP_RELAY_DEFERRED) {
		relay_piece(s, t, prev, now, seq);   /* a later part the hop relays: its chain (relay.bpf.h) */
		t->cont_ts = now;
		return;
	}
	if (in_send) {
		__u64 from = t->send_ts > prev ? t->send_ts : prev;
		if (!by_hop)
			piece_sender_work(s, t, prev, seq);
		if (now > from)
			span(PP_ST_WIRE, s->role, s->leg, s->hop, from, now - from, seq);
		t->cont_ts = now;
		return;
	}
	if (tcp && retx_delivered(sk, s, ws, now, seq, 0, prev))
		return;
	if (by_hop && !s->piece_relayed)
		stat_inc(PP_STAT_WIRE_UNPAIRED);
	else    /* sent earlier, let go by an ACK; through a hop relaying later parts, no stage of its own overlaps */
		span(PP_ST_WIRE, s->role, s->leg, s->hop, prev, now - prev, seq);
}

/* every piece into a request/response receiver: where the next one's time starts, and whether this one fills the
 * window; the sender's identity from a piece its own send delivered */
static __always_inline void piece_mark(struct sock *sk, struct pp_sock *s, struct pp_task *t, __u64 now)
{
	s->piece_ts = now;
	s->piece_full = piece_fills_window(sk);
	if (t && sending(t, (__u64)sk) && t->role != s->role) {
		s->peer_role = t->role;
		s->peer_hop = t->hop;
		s->piece_relayed = is_hop_role(t->role) && t->consume_later == PP_RELAY_DEFERRED;
	}
}

#endif /* PATHPROF_STALL_BPF_H */
