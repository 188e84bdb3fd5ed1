/* A qemu guest behind a tap: qemu (with the guest it runs) is the hop.
 * Part of pathprof.bpf.c (one object: every family shares its maps); included in order, not alone. */
#ifndef PATHPROF_GUEST_BPF_H
#define PATHPROF_GUEST_BPF_H

/* ---------------- a qemu guest behind a tap: qemu (with the guest it runs) is the hop ----------------
 * The guest's kernel is invisible. Request: the data skb's net_dev_start_xmit on the tap (pp_dev_xmit keeps the
 * tracked sender's send start) -> qemu reads it from the tap fd (tun consumes the skb in qemu's context):
 * wire.<qemu> from the send to the read, with dev.<tap> inside it. Then hop.<qemu> on the server leg (qemu +
 * guest kernel + guest server) until qemu writes the response to the tap (its first netif_receive_skb, in
 * qemu's context), which starts the response's wire. qemu's reads and writes of the tap may be on different
 * threads: the hop's start is kept per connection (guestq, keyed by the client's end). Both programs are
 * attached only when a qemu hop is tracked. */
static __always_inline __u64 conn_key(__u32 addr, __u16 port) { return ((__u64)addr << 16) | port; }

SEC("tp_btf/consume_skb")
int BPF_PROG(pp_tap_read, struct sk_buff *skb, void *location)
{
	__u64 ws = win_start();
	if (!ws)
		return 0;
	struct pp_devq *q = devq_match(skb);
	if (!q)
		return 0;
	q->skb = 0;                       /* the skb is freed: its address will be reused */
	struct pp_task *t = cur_task(ws);
	if (t && t->role == PP_ROLE_QEMU && q->ts >= ws) {
		__u64 now = bpf_ktime_get_ns();
		if (q->send_ts >= ws && q->ts > q->send_ts)
			span(PP_ST_WIRE, PP_ROLE_QEMU, q->leg, t->hop, q->send_ts, now - q->send_ts, 0);
		struct pp_stage_key k = { .stage = PP_ST_DEV, .leg = q->leg, .hop = q->ifindex, .netns = q->netns };
		stage_add(&k, now - q->ts);
		struct pp_tuple tu = {};
		if (q->leg == PP_LEG_REQUEST && ip_tuple(skb->head + skb->network_header, &tu)) {
			__u64 c = conn_key(tu.saddr, tu.sport);
			bpf_map_update_elem(&guestq, &c, &now, BPF_ANY);
		}
	} else if (t && q->ts < ws) {
		stat_inc(PP_STAT_WINDOW_EDGE);
	}
	return 0;
}

SEC("tp_btf/netif_receive_skb")
int BPF_PROG(pp_tap_recv, struct sk_buff *skb)
{
	if (skb->protocol != bpf_htons(ETH_P_IP_NUM) || skb->skb_iif)
		return 0;                     /* skb_iif: not the first device receive of this skb (bridge) */
	__u64 ws = win_start();
	if (!ws)
		return 0;
	struct pp_task *t = cur_task(ws);
	if (!t || t->role != PP_ROLE_QEMU)
		return 0;
	struct pp_tuple tu = {};
	if (!ip_tuple(skb->data, &tu) || !tu.payload || tuple_leg(&tu) != PP_LEG_RESPONSE)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	__u64 c = conn_key(tu.daddr, tu.dport), *start = bpf_map_lookup_elem(&guestq, &c);
	if (start && *start >= ws && now > *start) {
		span(PP_ST_PROC, PP_ROLE_QEMU, PP_LEG_SERVER, t->hop, *start, now - *start, 0);
		bpf_map_delete_elem(&guestq, &c);
	} else {
		stat_inc(PP_STAT_PROC_UNPAIRED);   /* a second segment of the response, or begun before the window */
	}
	t->send_ts = now;                 /* the response's wire: delivery runs inside this write */
	t->in_send = 1;
	return 0;
}

#endif /* PATHPROF_GUEST_BPF_H */
