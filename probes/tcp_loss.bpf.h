/* TCP loss recovery: a message whose segment was lost reaches its receiver only with a retransmission, from the
 * sender's timer or ACK processing, where no send is in progress: its wire had no start (wire_unpaired) and the
 * recovery wait was in no stage. At tcp_retransmit_skb the sender's socket knows the message's send start
 * (pp_sock.last_send); it is parked in `retx` under the sequence number the receiver will have reached
 * (rcv_nxt) when the retransmission is delivered, and the receiver's sk_data_ready that finds no send in
 * progress looks its rcv_nxt up: retx_<kind>.<receiver> = send start -> last retransmission (the wait for
 * recovery), wire.<receiver> = the retransmission's own trip. Sequence numbers, not the connection's tuple:
 * NAT (Docker's DNAT and MASQUERADE, any conntrack NAT without a sequence-adjusting helper) rewrites addresses
 * and ports between the two ends, never sequence numbers. Every retransmission is also counted by outgoing leg.
 * Part of pathprof.bpf.c (one object: every family shares its maps); included in order, not alone. */
#ifndef PATHPROF_TCP_LOSS_BPF_H
#define PATHPROF_TCP_LOSS_BPF_H

#define ICSK_TIME_LOSS_PROBE_NUM 5

static __always_inline struct pp_retx *retx_slot(__u32 seq)
{
	__u32 h = seq * 2654435761u;
	__u32 idx = (h ^ (h >> 16)) & (PP_RETX_SLOTS - 1);
	return bpf_map_lookup_elem(&retx, &idx);
}

/* park the message under one of its keys */
static __always_inline void retx_park(__u32 seq, __u32 other, __u8 kind, __u64 sent, __u64 now, __u64 ws)
{
	struct pp_retx *r = retx_slot(seq);
	if (!r)
		return;
	/* another message's stamp that could still be taken (retx_delivered's bound) is lost: counted; not one
	 * of the same message, nor one whose message was delivered without it (a spurious retransmission) */
	if (r->send_ts && r->seq != seq && r->other != seq && r->retx_ts >= ws &&
	    now - r->retx_ts <= r->retx_ts - r->send_ts)
		stat_inc(PP_STAT_RETX_SLOT_LOST);
	r->seq = seq;
	r->other = other;
	r->kind = kind;
	r->send_ts = sent;
	r->retx_ts = now;
	__u32 last = PP_RETX_LAST;
	struct pp_retx *l = bpf_map_lookup_elem(&retx, &last);
	if (l)
		l->retx_ts = now;
}

/* A retransmission was parked in this window: deliveries look for theirs before anything else. It is sent from a
 * timer's softirq, in whatever task that softirq interrupted: when that task was inside a send of its own, a netem
 * qdisc's hold took that send's start for the retransmission's (qdisc.bpf.h hold_start), and the delivery made a
 * wire of it while the recovery wait was in no stage (nic, 16 clients, 1 % loss: ~15 % of the stalls of ~210 ms,
 * the latency view -5 ... -15 %) */
static __always_inline int retx_recent(__u64 ws)
{
	__u32 last = PP_RETX_LAST;
	struct pp_retx *l = bpf_map_lookup_elem(&retx, &last);
	return l && l->retx_ts >= ws;
}

SEC("tp_btf/tcp_retransmit_skb")
int BPF_PROG(pp_tcp_retransmit, const struct sock *csk, const struct sk_buff *skb)
{
	__u64 ws = win_start();
	if (!ws)
		return 0;
	struct sock *sk = (struct sock *)csk;
	struct pp_sock *s = sock_get(&socks, sk);
	if (!s)
		return 0;                     /* not a socket of the run's */
	struct tcp_sock *tp = tcp_sk_of(sk);
	if (!tp)
		return 0;
	struct inet_connection_sock *icsk = &tp->inet_conn;
	__u8 ca = BPF_CORE_READ_BITFIELD_PROBED(icsk, icsk_ca_state);
	__u8 kind = tcp_field(icsk, icsk_pending) == ICSK_TIME_LOSS_PROBE_NUM ? PP_ST_RETX_PROBE :
		    ca == TCP_CA_Loss ? PP_ST_RETX_RTO : ca == TCP_CA_Recovery ? PP_ST_RETX_FAST : PP_ST_RETX_PROBE;
	stat_inc(PP_STAT_RETRANSMITS);
	__u8 out = s->leg == PP_LEG_REQUEST ? PP_LEG_RESPONSE : PP_LEG_REQUEST;   /* s->leg is what arrives */
	struct pp_stage_key k = { .stage = PP_ST_RETX_COUNT, .role = s->role, .leg = out,
				  .sub = kind - PP_ST_RETX_RTO + 1, .hop = s->hop };
	stage_add(&k, 0);
	__u64 sent = s->last_send;
	if (sent < ws)
		return 0;                     /* its message began before the window */
	/* the sender has closed its end (FIN_WAIT1, CLOSING, LAST_ACK): its last message was the one before its
	 * FIN -- in PostgreSQL's protocol a Terminate, or a hop passing it on --, which no one waits for; timed as a
	 * recovery wait it was added to a cycle that had gone on without it (-C through docker-proxy over 2 % loss:
	 * +9.6 ... +18.8 %). Counted above with every retransmission */
	__u8 state = sk->__sk_common.skc_state;
	if (state != TCP_ESTABLISHED && state != TCP_CLOSE_WAIT)
		return 0;
	/* delivered when the receiver's rcv_nxt reaches everything sent so far (snd_nxt), or, when later segments
	 * are lost too and wait for their own retransmissions, the end of this one */
	__u32 nxt = BPF_CORE_READ(tp, snd_nxt);
	__u32 end = BPF_CORE_READ((struct tcp_skb_cb *)&skb->cb[0], end_seq);
	__u64 now = bpf_ktime_get_ns();
	retx_park(nxt, end, kind, sent, now, ws);
	if (end != nxt)
		retx_park(end, nxt, kind, sent, now, ws);
	return 0;
}

/* The receiver's sk_data_ready found no send in progress: was it a retransmission of a message of the run's?
 * Then its wire starts at the message's send and the recovery wait is split out; 1 when spans were emitted (or,
 * for a --connect setup message, left to the connection probe, whose steps hold its wait: counted only). */
static __always_inline int retx_delivered(struct sock *sk, struct pp_sock *s, __u64 ws, __u64 now, __u32 seq,
					  int setup, __u64 floor)
{
	__u32 seq_key = BPF_CORE_READ((struct tcp_sock *)sk, rcv_nxt);
	struct pp_retx *r = retx_slot(seq_key);
	if (!r || !r->send_ts || r->seq != seq_key)
		return 0;
	__u64 sent = r->send_ts > floor ? r->send_ts : floor, rt = r->retx_ts;   /* floor: a further piece's wait
										     * starts at the piece before it */
	__u8 kind = r->kind;
	r->send_ts = 0;
	if (r->other != seq_key) {        /* the message's other key: no later delivery may take it */
		struct pp_retx *o = retx_slot(r->other);
		if (o && o->send_ts == sent && o->seq == r->other)
			o->send_ts = 0;
	}
	/* a sequence number is reached once, so a stamp whose message was delivered without it (a spurious
	 * retransmission: its ACK was lost) is never taken; what is taken must still look like this message's: the
	 * retransmission's own trip is shorter than the wait before it */
	if (sent < ws || !(sent <= rt && rt <= now) || now - rt > rt - sent)
		return 0;
	if (setup) {
		/* the connection probe's steps hold its wait (backend_init_auth, ready_delivery or unsplit): kept apart
		 * by where it falls, so the analysis can name it without counting it twice */
		__u64 got = BPF_CORE_READ((struct tcp_sock *)sk, bytes_received);
		struct pp_stage_key k = { .stage = PP_ST_SETUP_RETX, .role = s->role, .leg = s->leg, .hop = s->hop,
					  .sub = s->role == PP_ROLE_BACKEND || got <= 1 ? 1 : 2 };
		stage_add(&k, rt - sent);
		stat_inc(PP_STAT_RETX_SETUP);
		return 1;
	}
	struct pp_stage_key k = { .stage = kind, .role = s->role, .leg = s->leg, .hop = s->hop };
	stage_add(&k, rt - sent);
	trace_emit(kind, s->role, s->leg, s->hop, sent, rt - sent, seq);
	span(PP_ST_WIRE, s->role, s->leg, s->hop, rt, now - rt, seq);
	stat_inc(PP_STAT_RETX_DELIVERED);
	return 1;
}

#endif /* PATHPROF_TCP_LOSS_BPF_H */
