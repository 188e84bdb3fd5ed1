/* SYN and SYN-ACK retransmits as stages of the connect leg (issue #22): a handshake whose SYN or SYN-ACK was lost
 * on the wire, or whose SYN a full listen queue dropped, waits for a retransmission timer (1 s, then doubling);
 * a connection whose final ACK a full accept queue dropped waits for the server's SYN-ACK timer or the client's
 * own data timer. Without these stages the wait sat inside connect.tcp_handshake / connect.accept (or, with no
 * backend paired to its client, connect.unsplit) under a name that says nothing of loss.
 *
 *   connect.syn_retx     client SYN_SENT -> the handshake's last retransmission before the client's ESTABLISHED:
 *                        its own SYN again (tcp_retransmit_skb in SYN_SENT), or the server's SYN-ACK again
 *                        (tcp_retransmit_synack, fired by the server's timer and by a retransmitted SYN alike).
 *                        Emitted by the client alone, so it holds with a hop or NAT in between.
 *   connect.synack_retx  client ESTABLISHED -> the last retransmission before the postmaster's accept() took
 *                        the connection (the server's SYN-ACK again, or the client's first data again).
 *                        Needs the backend paired with its client (it splits connect.accept).
 *
 * A SYN-ACK names its connection by the server's initial sequence number (request_sock snt_isn), which the
 * client's rcv_nxt - 1 is at ESTABLISHED: sequence numbers, not addresses, so NAT between the two ends does not
 * matter (tcp_loss.bpf.h does the same for data). Cost: these programs run per retransmission only, and one
 * map lookup per client connection at ESTABLISHED; nothing on a healthy connection's packets.
 * Part of conn.bpf.c (its maps and helpers), included after them. */
#ifndef PATHPROF_CONN_SYN_BPF_H
#define PATHPROF_CONN_SYN_BPF_H

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);   /* half-open connections whose SYN-ACK was sent again: LRU bounds them */
	__uint(max_entries, 4096);
	__type(key, __u32);                    /* the server's initial sequence number */
	__type(value, __u64);                  /* its SYN-ACK's last retransmission */
} synack_retx SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);   /* clients ESTABLISHED, not paired yet: LRU bounds the never-paired */
	__uint(max_entries, 4096);
	__type(key, __u32);                    /* the server's initial sequence number */
	__type(value, __u64);                  /* the client's struct sock * (its `pending` key) */
} isn_pending SEC(".maps");

static __always_inline __u64 synack_retx_ts(__u32 isn, int take)
{
	__u64 *v = bpf_map_lookup_elem(&synack_retx, &isn), ts = v ? *v : 0;
	if (v && take)
		bpf_map_delete_elem(&synack_retx, &isn);
	return ts;
}

/* the client is ESTABLISHED: its handshake waited for a retransmission when one came after its start */
static __always_inline void syn_established(struct pc_pending *p, const struct sock *sk, __u64 now)
{
	__u32 isn = BPF_CORE_READ((struct tcp_sock *)sk, rcv_nxt) - 1;    /* the SYN-ACK took one */
	__u64 last = p->retx_ts, sa = synack_retx_ts(isn, 0);
	if (sa > p->start_ts && sa <= now && sa > last)
		last = sa;
	p->srv_isn = isn;
	p->est_ts = now;
	__u64 key = (__u64)sk;
	bpf_map_update_elem(&isn_pending, &isn, &key, BPF_ANY);
	p->retx_ts = 0;                        /* from here: retransmissions before the server takes it */
	p->hs_from = last > p->start_ts ? last : p->start_ts;
	if (last > p->start_ts) {
		step_charge(PC_ST_SYN_RETX, p->start_ts, last);
		if (p->sampled)
			cstat(PC_STAT_HS_RETX_SAMPLED);
	}
}

/* the postmaster took the connection at `accept_ts`: where connect.accept starts (the client's ESTABLISHED, or
 * the last retransmission before the accept: the wait for it is connect.synack_retx); the start on unix */
static __always_inline __u64 syn_accept_from(struct pc_pending *p, __u64 accept_ts, int sampled)
{
	__u64 est = p->est_ts, last = 0;
	if (!est)
		return p->start_ts;
	__u64 sa = synack_retx_ts(p->srv_isn, 1);
	if (sa > est && sa < accept_ts)
		last = sa;
	if (p->retx_ts > est && p->retx_ts < accept_ts && p->retx_ts > last)
		last = p->retx_ts;
	if (!last)
		return est;
	step_charge(PC_ST_SYNACK_RETX, est, last);
	if (sampled)
		cstat(PC_STAT_SYNACK_RETX_SAMPLED);
	return last;
}

/* The client of a backend whose hello woke no client socket inside its send: the hello reached the client later
 * (a delay line reinjecting it, ksoftirqd) or through NAT (other ports). The backend's socket names the server's
 * initial sequence number -- snd_una - bytes_acked is it + 1, since the SYN-ACK took one -- and so did the client's
 * at ESTABLISHED (syn_established): NAT and delay lines rewrite or hold packets, never sequence numbers. A hop in
 * between opens a connection of its own (another ISN): no client is found, as before. 0: none. */
static __always_inline __u64 syn_peer_by_isn(struct sock *sk)
{
	if (sk->__sk_common.skc_family == AF_UNIX)
		return 0;
	struct tcp_sock *tp = (struct tcp_sock *)sk;
	__u32 isn = BPF_CORE_READ(tp, snd_una) - (__u32)BPF_CORE_READ(tp, bytes_acked) - 1;
	__u64 *key = bpf_map_lookup_elem(&isn_pending, &isn);
	if (!key)
		return 0;
	__u64 peer = *key;
	bpf_map_delete_elem(&isn_pending, &isn);
	/* the client's socket may be another connection's by now (freed and reused): its start must be this one */
	struct pc_pending *p = bpf_map_lookup_elem(&pending, &peer);
	if (!p || p->srv_isn != isn || !p->est_ts)
		return 0;
	cstat(PC_STAT_ISN_PAIRED);
	return peer;
}

SEC("tp_btf/tcp_retransmit_skb")
int BPF_PROG(pc_retransmit, const struct sock *sk, const struct sk_buff *skb)
{
	__u8 state = sk->__sk_common.skc_state;
	if ((state != TCP_SYN_SENT && state != TCP_ESTABLISHED) || !is_svc_port(bpf_ntohs(sk->__sk_common.skc_dport)) ||
	    !in_path_netns(sk))
		return 0;
	__u64 key = (__u64)sk;
	struct pc_pending *p = bpf_map_lookup_elem(&pending, &key);
	if (state == TCP_ESTABLISHED) {
		/* the client's first data again, before its backend was paired: its final ACK may have been dropped */
		if (p && p->est_ts)
			p->retx_ts = bpf_ktime_get_ns();
		return 0;
	}
	/* the client's SYN again: the first was lost, or dropped by a full listen queue */
	cstat(PC_STAT_SYN_RETRANS);
	if (p) {
		p->retx_ts = bpf_ktime_get_ns();
		if (p->sampled)
			cstat(PC_STAT_SYN_RETRANS_SAMPLED);
	}
	return 0;
}

SEC("tp_btf/tcp_retransmit_synack")
int BPF_PROG(pc_retransmit_synack, const struct sock *sk, const struct request_sock *req)
{
	/* sk is the listener; the SYN-ACK went again on its timer (the client's ACK did not make it into the accept
	 * queue, or the SYN-ACK was lost) or answering a retransmitted SYN */
	if (!is_svc_port(sk->__sk_common.skc_num) || !in_path_netns(sk))
		return 0;
	cstat(PC_STAT_SYNACK_RETRANS);
	__u32 isn = BPF_CORE_READ((struct tcp_request_sock *)req, snt_isn);
	__u64 now = bpf_ktime_get_ns();
	bpf_map_update_elem(&synack_retx, &isn, &now, BPF_ANY);
	return 0;
}

#endif /* PATHPROF_CONN_SYN_BPF_H */
