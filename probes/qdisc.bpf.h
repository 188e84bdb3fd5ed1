/* Link impairments (topologies.impairments), included by pathprof.bpf.c (it shares that object's maps and helpers).
 * Two places hold a data skb of the run on an impaired link, each timed as its own stage (PP_ST_QDISC, hop =
 * ifindex, netns = the device's), so a delay lands where it was put instead of in the wire:
 *   sub 0, qdisc.<dev>: the device's root qdisc (a tbf rate limit; netem where the kernel has it),
 *                       qdisc_enqueue -> qdisc_dequeue tracepoints;
 *   sub 1, delay.<dev>: pathprof's delay line, an NFQUEUE in the mangle table that pp-delayline answers after
 *                       the delay (kernels without sch_netem): BPF netfilter programs just before (-151) and just
 *                       after (-149) the mangle table (-150) of that hook.
 * Loaded and attached only when the run has an impaired link (qdisc_on; agent.probing.session): other paths pay nothing.
 *
 * A held packet leaves later, from a timer's softirq or the delay line's verdict, on whatever the CPU then runs:
 * its delivery (sk_data_ready) is not inside the sender's send, where pp_sk_data_ready finds the send start on
 * every other path. So the hold keeps the sender's send start with the skb, and the receive of that skb on the
 * far side (netif_receive_skb, in the NET_RX softirq that delivers it) leaves it for the sk_data_ready that
 * follows in the same softirq (qdisc_send_start). */
#ifndef PATHPROF_QDISC_BPF_H
#define PATHPROF_QDISC_BPF_H

const volatile __u32 qdisc_on = 0;      /* the run has a netem link: the programs below are attached */

#define PP_QDQ_SLOTS 4096               /* power of two */
#define PP_QDQ_BULK 8                   /* skbs of one bulk dequeue looked at */

struct pp_qdq {                         /* a data skb in a qdisc: direct-mapped by skb address, as devq */
	__u64 skb;                          /* 0 = free */
	__u64 head;
	__u64 ts;                           /* enqueue */
	__u64 send_ts;                      /* the tracked sender's send start when it enqueued, else 0 */
	__u32 ifindex, netns;
	__u8  leg, dequeued, sub;           /* sub: 0 qdisc, 1 delay line */
	__u8  received;                     /* held after its receive (a PREROUTING/INPUT delay line): no
					     * netif_receive_skb of its own follows to take the send start */
	__u8  pad[4];
};

struct pp_qdrx {                        /* per CPU: the send start of the skb being received, for sk_data_ready */
	__u64 send_ts;                      /* 0 = none */
	__u64 softirq;                      /* cpust.softirq_start of the NET_RX softirq that received it */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, PP_QDQ_SLOTS);
	__type(key, __u32);
	__type(value, struct pp_qdq);
} qdq SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct pp_qdrx);
} qdrx SEC(".maps");

static __always_inline struct pp_qdq *qdq_slot(struct sk_buff *skb)
{
	__u64 a = (__u64)skb;
	__u32 idx = (__u32)((a >> 8) ^ (a >> 20)) & (PP_QDQ_SLOTS - 1);
	return bpf_map_lookup_elem(&qdq, &idx);
}

/* q begins holding skb; the send start it carries is kept when the skb comes straight out of another hold
 * (the delay line, then a rate-limiting qdisc): the current task is then not its sender */
static __always_inline void hold_start(struct pp_qdq *q, struct sk_buff *skb, __u64 ws, __u32 ifindex, __u32 netns,
				       __u8 leg, __u8 sub)
{
	if (q->skb == (__u64)skb && q->head == (__u64)skb->head && q->dequeued && q->ts >= ws) {
		/* keep q->send_ts */
	} else {
		if (q->skb && q->skb != (__u64)skb && q->ts >= ws)
			stat_inc(PP_STAT_DEV_OVERWRITTEN);
		struct pp_task *t = cur_task(ws);
		q->send_ts = t && sending(t, 0) ? t->send_ts : 0;
	}
	q->head = (__u64)skb->head;
	q->ifindex = ifindex;
	q->netns = netns;
	q->leg = leg;
	q->sub = sub;
	q->dequeued = 0;
	q->received = 0;
	q->ts = bpf_ktime_get_ns();
	q->skb = (__u64)skb;
}

/* q stops holding skb (matched by the caller): its stage, and the skb is kept for its receive. received: the hold
 * was on the receive side, after the skb's netif_receive_skb: none follows to take (and free) the slot, which stays
 * behind, and must not lend this send start to another skb that reuses the address (and head) later: on
 * docker-dnat with docker-proxy the proxy's loopback replies to pgbench did, and their wire.pgbench ran from a
 * request held hundreds of ms before (1 % loss, 4 clients: closure +12.9 … +22.9 %) */
static __always_inline void hold_end(struct pp_qdq *q, struct sk_buff *skb, __u64 ws, __u64 now, __u8 received)
{
	if (q->head != (__u64)skb->head || q->ts < ws || now - q->ts > DEV_STALE_NS) {
		stat_inc(q->ts < ws ? PP_STAT_WINDOW_EDGE : PP_STAT_DEV_STALE);
		q->skb = 0;
		return;
	}
	struct pp_stage_key k = { .stage = PP_ST_QDISC, .sub = q->sub, .leg = q->leg, .hop = q->ifindex,
				  .netns = q->netns };
	stage_add(&k, now - q->ts);
	q->dequeued = 1;                    /* the send start travels on to the receive */
	q->received = received;
}

SEC("tp_btf/qdisc_enqueue")
int BPF_PROG(pp_qdisc_enq, struct Qdisc *qd, const struct netdev_queue *txq, struct sk_buff *skb)
{
	__u64 ws = win_start();
	if (!ws)
		return 0;
	struct net_device *dev = skb->dev;
	__u32 netns = 0;
	__u8 leg = data_skb_leg(skb, dev, &netns);
	struct pp_qdq *q = leg ? qdq_slot(skb) : 0;
	if (!q)
		return 0;
	if (q->skb && q->skb != (__u64)skb && q->ts >= ws)
		stat_inc(PP_STAT_DEV_OVERWRITTEN);
	hold_start(q, skb, ws, dev->ifindex, netns, leg, 0);
	return 0;
}

/* skb is the first of the skbs dequeued together (a bulk dequeue chains them by ->next), or NULL */
SEC("tp_btf/qdisc_dequeue")
int BPF_PROG(pp_qdisc_deq, struct Qdisc *qd, const struct netdev_queue *txq, int packets, struct sk_buff *skb)
{
	__u64 ws = win_start();
	if (!ws)
		return 0;
	__u64 now = 0;
	for (int i = 0; i < PP_QDQ_BULK && skb; i++) {
		struct pp_qdq *q = qdq_slot(skb);
		if (q && q->skb == (__u64)skb && !q->dequeued && !q->sub) {
			if (!now)
				now = bpf_ktime_get_ns();
			hold_end(q, skb, ws, now, 0);
		}
		skb = skb->next;
	}
	return 0;
}

/* The delay line: brackets around the mangle table (-150) of the hook whose NFQUEUE rule holds the packet,
 * attached only there (agent.probing.session: ProbeConfig.holds). The device is the rule's: out at postrouting, in at
 * prerouting. pathprof's own bracket of the whole hook (nf_begin, INT_MIN+1) is told to forget this skb: its
 * nf_end would run after the hold, in the delay line's context, and count the hold as netfilter CPU work. */
#define NF_HOOK_LOCAL_IN 1              /* PREROUTING (0) and INPUT (1) run after netif_receive_skb */
#define NF_HOOK_POST_ROUTING 4

SEC("netfilter")
int pp_hold_begin(struct bpf_nf_ctx *ctx)
{
	__u64 ws = win_start();
	if (!ws)
		return NF_ACCEPT;
	struct sk_buff *skb = ctx->skb;
	struct pp_tuple tu = {};
	if (!ip_tuple(skb->data, &tu) || !tu.payload)
		return NF_ACCEPT;
	__u8 leg = tuple_leg(&tu);
	__u32 hook = ctx->state->hook;
	if (!leg || hook >= 5)
		return NF_ACCEPT;
	struct net_device *dev = hook == NF_HOOK_POST_ROUTING ? BPF_CORE_READ(ctx->state, out)
							       : BPF_CORE_READ(ctx->state, in);
	if (!dev)
		return NF_ACCEPT;
	__u32 nested = hook + 5;
	struct pp_nf_slot *s = bpf_map_lookup_elem(&nfslot, &nested);
	if (!s || s->skb != (__u64)skb)
		s = bpf_map_lookup_elem(&nfslot, &hook);
	if (s && s->skb == (__u64)skb)
		s->skb = 0;
	struct pp_qdq *q = qdq_slot(skb);
	if (q)
		hold_start(q, skb, ws, BPF_CORE_READ(dev, ifindex), BPF_CORE_READ(dev, nd_net.net, ns.inum), leg, 1);
	return NF_ACCEPT;
}

SEC("netfilter")
int pp_hold_end(struct bpf_nf_ctx *ctx)
{
	__u64 ws = win_start();
	if (!ws)
		return NF_ACCEPT;
	struct sk_buff *skb = ctx->skb;
	struct pp_qdq *q = qdq_slot(skb);
	if (q && q->skb == (__u64)skb && !q->dequeued && q->sub == 1)
		hold_end(q, skb, ws, bpf_ktime_get_ns(), ctx->state->hook <= NF_HOOK_LOCAL_IN);
	return NF_ACCEPT;
}

SEC("tp_btf/netif_receive_skb")
int BPF_PROG(pp_qdisc_recv, struct sk_buff *skb)
{
	__u64 ws = win_start();
	if (!ws)
		return 0;
	__u32 zero = 0;
	struct pp_qdrx *rx = bpf_map_lookup_elem(&qdrx, &zero);
	if (!rx)
		return 0;
	rx->send_ts = 0;                    /* whatever this skb is, an earlier one's send start no longer applies */
	struct pp_qdq *q = qdq_slot(skb);
	if (!q || q->skb != (__u64)skb)
		return 0;
	q->skb = 0;
	if (!q->dequeued || q->received || q->head != (__u64)skb->head || q->send_ts < ws)
		return 0;                   /* received: a slot left by a receive-side hold, another skb here */
	struct pp_cpu_state *cs = cpu_state(ws);
	if (cs && cs->softirq_start) {
		rx->send_ts = q->send_ts;
		rx->softirq = cs->softirq_start;
	}
	return 0;
}

/* For pp_sk_data_ready: the send start of the skb this NET_RX softirq is delivering, when it came out of a
 * qdisc of the run (taken: one message per skb), else 0. */
static __always_inline __u64 qdisc_send_start(__u64 ws)
{
	__u32 zero = 0;
	struct pp_qdrx *rx = bpf_map_lookup_elem(&qdrx, &zero);
	if (!rx || !rx->send_ts)
		return 0;
	__u64 s = rx->send_ts;
	rx->send_ts = 0;
	struct pp_cpu_state *cs = cpu_state(ws);
	return cs && cs->softirq_start && cs->softirq_start == rx->softirq ? s : 0;
}
#endif
