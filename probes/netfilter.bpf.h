/* Netfilter brackets: BPF netfilter programs at INT_MIN+1 / INT_MAX-1 around each hook.
 * Part of pathprof.bpf.c (one object: every family shares its maps); included in order, not alone. */
#ifndef PATHPROF_NETFILTER_BPF_H
#define PATHPROF_NETFILTER_BPF_H

/* ---------------- netfilter brackets ----------------
 * nf_begin is linked at priority INT_MIN+1 and nf_end at INT_MAX-1 on the IPv4 hooks that have functions
 * registered in a namespace of the topology (the front end lists them), so the time between them is what the
 * hook's other functions (iptables/nftables chains, conntrack, NAT) cost that packet. Only the run's packets
 * (TCP to/from a service port) are timed. nf_begin reads the clock last and nf_end first, so the brackets'
 * own work stays outside. Conntrack confirm runs at INT_MAX, after nf_end, and is not included. In every
 * IPv4 hook skb->data is the IP header. Program type/attach type are set by the loader (libbpf 1.1 predates
 * them). */
SEC("netfilter")
int nf_begin(struct bpf_nf_ctx *ctx)
{
	__u64 ws = win_start();
	if (!ws)
		return NF_ACCEPT;
	struct sk_buff *skb = ctx->skb;
	struct pp_tuple tu = {};
	if (!ip_tuple(skb->data, &tu))
		return NF_ACCEPT;
	__u8 leg = tuple_leg(&tu);
	__u32 hook = ctx->state->hook;
	if (!leg || hook >= 5)
		return NF_ACCEPT;
	struct pp_nf_slot *s = bpf_map_lookup_elem(&nfslot, &hook);
	if (s && s->skb && s->ts < ws) {
		stat_inc(PP_STAT_WINDOW_EDGE);    /* parked in an earlier window */
		s->skb = 0;
	}
	if (s && s->skb && bpf_ktime_get_ns() - s->ts > NF_STALE_NS) {
		stat_inc(PP_STAT_NF_UNPAIRED);    /* stale: that packet left between the brackets (stolen/dropped) */
		s->skb = 0;
	}
	if (s && s->skb) {                /* nested traversal of the same hook (softirq inside process) */
		__u32 nested = hook + 5;
		s = bpf_map_lookup_elem(&nfslot, &nested);
		if (s && s->skb) {
			stat_inc(PP_STAT_NF_NESTED_FULL);  /* a third one, or a preempted traversal: not timed */
			return NF_ACCEPT;
		}
	}
	if (!s)
		return NF_ACCEPT;
	s->skb = (__u64)skb;
	s->saddr = tu.saddr;
	s->daddr = tu.daddr;
	s->sport = tu.sport;
	s->dport = tu.dport;
	s->leg = leg;
	s->data = tu.payload > 0;
	s->ts = bpf_ktime_get_ns();
	return NF_ACCEPT;
}

SEC("netfilter")
int nf_end(struct bpf_nf_ctx *ctx)
{
	__u64 ws = win_start();
	if (!ws)
		return NF_ACCEPT;
	__u32 hook = ctx->state->hook;
	if (hook >= 5)
		return NF_ACCEPT;
	__u64 skb = (__u64)ctx->skb;
	__u32 nested = hook + 5;
	struct pp_nf_slot *s = bpf_map_lookup_elem(&nfslot, &nested);
	if (!s || s->skb != skb) {
		s = bpf_map_lookup_elem(&nfslot, &hook);
		if (!s || s->skb != skb)
			return NF_ACCEPT;         /* not one of ours (ours always have a slot) */
	}
	__u64 now = bpf_ktime_get_ns();
	s->skb = 0;
	if (s->ts < ws) {                 /* bracket opened before the window: not a whole traversal */
		stat_inc(PP_STAT_WINDOW_EDGE);
		return NF_ACCEPT;
	}
	__u64 d = now - s->ts;
	struct pp_tuple tu = {};
	if (ip_tuple(ctx->skb->data, &tu) && (tu.saddr != s->saddr || tu.daddr != s->daddr ||
					 tu.sport != s->sport || tu.dport != s->dport))
		stat_inc(PP_STAT_NF_NAT);
	stat_inc(PP_STAT_NF_PACKETS);
	__u32 idx = ((netns_slot_of(ctx->state->net->ns.inum) * 5 + hook) * 2 +
		     (s->leg == PP_LEG_RESPONSE)) * 2;
	struct pp_hist *h = bpf_map_lookup_elem(&nfagg, &idx);
	if (h)
		hist_add(h, d);
	if (s->data) {
		idx += 1;
		h = bpf_map_lookup_elem(&nfagg, &idx);
		if (h)
			hist_add(h, d);
	}
	struct pp_cpu_state *cs = cpu_state(ws);
	if (cs) {
		cs->nf_ns += d;
		cs->excl_total += d;
		if (cs->softirq_start)
			cs->nf_in_softirq += d;
	}
	return NF_ACCEPT;
}

#endif /* PATHPROF_NETFILTER_BPF_H */
