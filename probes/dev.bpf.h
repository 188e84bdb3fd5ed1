/* Device hops: a data skb's xmit -> receive on veth, bridge and tap.
 * Part of pathprof.bpf.c (one object: every family shares its maps); included in order, not alone. */
#ifndef PATHPROF_DEV_BPF_H
#define PATHPROF_DEV_BPF_H

/* ---------------- device hops: xmit -> receive of the same data skb ----------------
 * lo is timed only when asked (time_lo): on most paths it is ~0.5 us of the wire and two program runs per
 * packet; folded, its time stays inside wire.<receiver>. */
#define IFF_LOOPBACK_FLAG 0x8
SEC("tp_btf/net_dev_start_xmit")
int BPF_PROG(pp_dev_xmit, struct sk_buff *skb, struct net_device *dev)
{
	__u64 ws = win_start();
	if (!ws)
		return 0;
	if (!time_lo && (dev->flags & IFF_LOOPBACK_FLAG))
		return 0;                     /* lo folded into the wire: the cheapest exit, before any parsing */
	__u32 netns = 0;
	__u8 leg = data_skb_leg(skb, dev, &netns);
	struct pp_devq *q = leg ? devq_slot(skb) : 0;
	if (!q)
		return 0;
	if (q->skb && q->skb != (__u64)skb && q->ts >= ws)
		stat_inc(PP_STAT_DEV_OVERWRITTEN);
	struct pp_task *t = tap_wire ? cur_task(ws) : 0;  /* only a tap's reader (qemu) uses the send start */
	q->send_ts = t && sending(t, 0) ? t->send_ts : 0;     /* a tap: wire.qemu starts there */
	q->head = (__u64)skb->head;
	q->ifindex = dev->ifindex;
	q->netns = netns;
	q->leg = leg;
	q->ts = bpf_ktime_get_ns();
	q->skb = (__u64)skb;
	return 0;
}

/* the devq entry of skb, or 0; a reused skb address with another data buffer is stale (counted, freed) */
static __always_inline struct pp_devq *devq_match(struct sk_buff *skb)
{
	struct pp_devq *q = devq_slot(skb);
	if (!q || q->skb != (__u64)skb)
		return 0;
	if (q->head != (__u64)skb->head) {
		stat_inc(PP_STAT_DEV_STALE);
		q->skb = 0;
		return 0;
	}
	return q;
}

SEC("tp_btf/netif_receive_skb")
int BPF_PROG(pp_dev_recv, struct sk_buff *skb)
{
	__u64 ws = win_start();
	if (!ws)
		return 0;
	if (!time_lo && (skb->dev->flags & IFF_LOOPBACK_FLAG))
		return 0;
	struct pp_devq *q = devq_match(skb);
	if (!q)
		return 0;
	__u64 now = bpf_ktime_get_ns(), ts = q->ts;
	q->skb = 0;
	if (ts < ws) {
		stat_inc(PP_STAT_WINDOW_EDGE);
	} else if (now - ts > DEV_STALE_NS) {
		stat_inc(PP_STAT_DEV_STALE);
	} else {
		struct pp_stage_key k = { .stage = PP_ST_DEV, .leg = q->leg, .hop = q->ifindex, .netns = q->netns };
		stage_add(&k, now - ts);
	}
	return 0;
}

#endif /* PATHPROF_DEV_BPF_H */
