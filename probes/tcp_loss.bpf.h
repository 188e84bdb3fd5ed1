/* TCP loss recovery: a message whose segment was lost reaches its receiver only with a retransmission, from the
 * sender's timer or ACK processing, where no send is in progress: its wire had no start (wire_unpaired) and the
 * recovery wait was in no stage. At tcp_retransmit_skb the sender's socket knows the message's send start
 * (pp_sock.last_send); it is parked in `retx` by connection, and the receiver's sk_data_ready that finds no send
 * in progress takes it: retx_<kind>.<receiver> = send start -> last retransmission (the wait for recovery),
 * wire.<receiver> = the retransmission's own trip. Every retransmission is also counted by outgoing leg.
 * Part of pathprof.bpf.c (one object: every family shares its maps); included in order, not alone. */
#ifndef PATHPROF_TCP_LOSS_BPF_H
#define PATHPROF_TCP_LOSS_BPF_H

#define ICSK_TIME_LOSS_PROBE_NUM 5

static __always_inline __u32 retx_slot(__u32 saddr, __u32 daddr, __u16 sport, __u16 dport)
{
	__u32 h = saddr ^ (daddr * 2654435761u) ^ ((__u32)sport << 16 | dport) * 40503u;
	return (h ^ (h >> 15)) & (PP_RETX_SLOTS - 1);
}

SEC("tp_btf/tcp_retransmit_skb")
int BPF_PROG(pp_tcp_retransmit, const struct sock *csk, const struct sk_buff *skb)
{
	__u64 ws = win_start();
	if (!ws)
		return 0;
	struct sock *sk = (struct sock *)csk;
	struct pp_sock *s = bpf_sk_storage_get(&socks, sk, 0, 0);
	if (!s)
		return 0;                     /* not a socket of the run's */
	struct tcp_sock *tp = bpf_skc_to_tcp_sock(sk);
	if (!tp)
		return 0;
	struct inet_connection_sock *icsk = &tp->inet_conn;
	__u8 ca = BPF_CORE_READ_BITFIELD_PROBED(icsk, icsk_ca_state);
	__u8 kind = icsk->icsk_pending == ICSK_TIME_LOSS_PROBE_NUM ? PP_ST_RETX_PROBE :
		    ca == TCP_CA_Loss ? PP_ST_RETX_RTO : ca == TCP_CA_Recovery ? PP_ST_RETX_FAST : PP_ST_RETX_PROBE;
	stat_inc(PP_STAT_RETRANSMITS);
	__u8 out = s->leg == PP_LEG_REQUEST ? PP_LEG_RESPONSE : PP_LEG_REQUEST;   /* s->leg is what arrives */
	struct pp_stage_key k = { .stage = PP_ST_RETX_COUNT, .role = s->role, .leg = out,
				  .sub = kind - PP_ST_RETX_RTO + 1, .hop = s->hop };
	stage_add(&k, 0);
	__u64 sent = s->last_send;
	if (sent < ws)
		return 0;                     /* its message began before the window */
	__u32 saddr = sk->__sk_common.skc_rcv_saddr, daddr = sk->__sk_common.skc_daddr;
	__u16 sport = sk->__sk_common.skc_num, dport = bpf_ntohs(sk->__sk_common.skc_dport);
	__u32 idx = retx_slot(saddr, daddr, sport, dport);
	struct pp_retx *r = bpf_map_lookup_elem(&retx, &idx);
	if (!r)
		return 0;
	int same = r->send_ts && r->saddr == saddr && r->daddr == daddr && r->sport == sport && r->dport == dport;
	if (r->send_ts && !same)
		stat_inc(PP_STAT_RETX_SLOT_LOST);
	r->saddr = saddr;
	r->daddr = daddr;
	r->sport = sport;
	r->dport = dport;
	r->kind = kind;
	r->send_ts = sent;
	r->retx_ts = bpf_ktime_get_ns();
	return 0;
}

/* The receiver's sk_data_ready found no send in progress: was it a retransmission of a message of the run's?
 * Then its wire starts at the message's send and the recovery wait is split out; 1 when spans were emitted. */
static __always_inline int retx_delivered(struct sock *sk, struct pp_sock *s, __u64 ws, __u64 now, __u32 seq)
{
	/* the sender's view: its source is our peer */
	__u32 saddr = sk->__sk_common.skc_daddr, daddr = sk->__sk_common.skc_rcv_saddr;
	__u16 sport = bpf_ntohs(sk->__sk_common.skc_dport), dport = sk->__sk_common.skc_num;
	__u32 idx = retx_slot(saddr, daddr, sport, dport);
	struct pp_retx *r = bpf_map_lookup_elem(&retx, &idx);
	if (!r || !r->send_ts || r->saddr != saddr || r->daddr != daddr || r->sport != sport || r->dport != dport)
		return 0;
	__u64 sent = r->send_ts, rt = r->retx_ts;
	__u8 kind = r->kind;
	r->send_ts = 0;
	/* a stamp left by a retransmission whose message had been delivered already (its ACK was lost) would be
	 * taken by the next loss on the connection, much later: the retransmission's own trip is shorter than the
	 * wait before it, or it is not this message's */
	if (sent < ws || !(sent <= rt && rt <= now) || now - rt > rt - sent)
		return 0;
	struct pp_stage_key k = { .stage = kind, .role = s->role, .leg = s->leg, .hop = s->hop };
	stage_add(&k, rt - sent);
	trace_emit(kind, s->role, s->leg, s->hop, sent, rt - sent, seq);
	span(PP_ST_WIRE, s->role, s->leg, s->hop, rt, now - rt, seq);
	stat_inc(PP_STAT_RETX_DELIVERED);
	return 1;
}

#endif /* PATHPROF_TCP_LOSS_BPF_H */
