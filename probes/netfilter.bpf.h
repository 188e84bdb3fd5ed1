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
/* A busy bracket slot whose packet cannot still be inside the hook is freed: opened in an earlier window, older
 * than any traversal, or opened before this CPU last switched tasks -- a traversal runs to its end on its CPU (a
 * nested one inside it, from a softirq, switches nothing), so that packet left between the brackets: stolen,
 * dropped, or queued to user space (NFQUEUE: a link's delay line) and reinjected on another CPU. */
static __always_inline void nf_slot_reclaim(struct pp_nf_slot *s, __u64 ws)
{
	if (s->ts < ws) {
		stat_inc(PP_STAT_WINDOW_EDGE);
		s->skb = 0;
		return;
	}
	struct pp_cpu_state *cs = cpu_state(ws);
	if (bpf_ktime_get_ns() - s->ts > NF_STALE_NS || (cs && cs->last_switch > s->ts)) {
		stat_inc(PP_STAT_NF_UNPAIRED);
		s->skb = 0;
	}
}

/* A traversal of a hook begins: from the BPF netfilter link at INT_MIN+1 (Linux >= 6.4), or from fentry on
 * nf_hook_slow, which runs every function of one hook for one packet (older kernels: pathprof.agent.probing.hooks) */
/* link (a constant): ctx is the link's context, its fields read where the link program always read them (the same
 * code as before the fallback existed); else the packet and state are fentry/fexit's arguments */
#define NF_SKB(c, arg) (link ? (c)->skb : (arg))
#define NF_STATE(c, arg) (link ? (c)->state : (arg))
static __always_inline int nf_open(const int link, struct bpf_nf_ctx *ctx, struct sk_buff *fskb,
				   const struct nf_hook_state *fstate)
{
	__u64 ws = win_start();
	if (!ws)
		return NF_ACCEPT;
	struct sk_buff *skb = NF_SKB(ctx, fskb);
	struct pp_tuple tu = {};
	if (!ip_tuple(skb->data, &tu))
		return NF_ACCEPT;
	__u8 leg = tuple_leg(&tu);
	__u32 hook = NF_STATE(ctx, fstate)->hook;
	if (!leg || hook >= 5)
		return NF_ACCEPT;
	struct pp_nf_slot *s = bpf_map_lookup_elem(&nfslot, &hook);
	if (s && s->skb)
		nf_slot_reclaim(s, ws);
	if (s && s->skb) {                /* nested traversal of the same hook (softirq inside process) */
		__u32 nested = hook + 5;
		s = bpf_map_lookup_elem(&nfslot, &nested);
		if (s && s->skb)
			nf_slot_reclaim(s, ws);
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
	s->state = (__u64)NF_STATE(ctx, fstate);
	s->ts = bpf_ktime_get_ns();
	return NF_ACCEPT;
}

/* ... and ends: the link at INT_MAX-1, or fexit of nf_hook_slow (which also covers the functions at INT_MAX,
 * conntrack's confirm among them: a few hundred ns more per packet than the links see) */
static __always_inline int nf_close(const int link, struct bpf_nf_ctx *ctx, struct sk_buff *fskb,
				    const struct nf_hook_state *fstate)
{
	__u64 ws = win_start();
	if (!ws)
		return NF_ACCEPT;
	__u32 hook = NF_STATE(ctx, fstate)->hook;
	if (hook >= 5)
		return NF_ACCEPT;
	__u64 skb = (__u64)NF_SKB(ctx, fskb);
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
	/* a packet queued to user space (an NFQUEUE rule between the brackets: a link's delay line) comes back
	 * through nf_reinject with the queue entry's copy of the hook state, in the reading process, after this CPU
	 * switched tasks: the time between is its wait in the queue (the delay.<dev> stage, or the wire's), not the
	 * hook's work, and none of it CPU. (Another state alone is not enough: the kernel stack's offset is
	 * randomised per syscall, so two test runs of one packet see two addresses.) */
	struct pp_cpu_state *cs = cpu_state(ws);
	if (s->state != (__u64)NF_STATE(ctx, fstate) && cs && cs->last_switch > s->ts) {
		stat_inc(PP_STAT_NF_QUEUED);
		return NF_ACCEPT;
	}
	__u64 d = now - s->ts;
	if (d > NF_STALE_NS) {            /* a stale bracket whose skb address came back: not one traversal */
		stat_inc(PP_STAT_NF_UNPAIRED);
		return NF_ACCEPT;
	}
	struct pp_tuple tu = {};
	if (ip_tuple(NF_SKB(ctx, fskb)->data, &tu) && (tu.saddr != s->saddr || tu.daddr != s->daddr ||
					 tu.sport != s->sport || tu.dport != s->dport))
		stat_inc(PP_STAT_NF_NAT);
	stat_inc(PP_STAT_NF_PACKETS);
	__u32 idx = ((netns_slot_of(NF_STATE(ctx, fstate)->net->ns.inum) * 5 + hook) * 2 +
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
	if (cs) {
		cs->nf_ns += d;
		cs->excl_total += d;
		if (cs->softirq_start)
			cs->nf_in_softirq += d;
	}
	return NF_ACCEPT;
}

SEC("netfilter")
int nf_begin(struct bpf_nf_ctx *ctx)
{
	return nf_open(1, ctx, 0, 0);
}

SEC("netfilter")
int nf_end(struct bpf_nf_ctx *ctx)
{
	return nf_close(1, ctx, 0, 0);
}

#define NFPROTO_IPV4_NUM 2
SEC("fentry/nf_hook_slow")
int BPF_PROG(nf_begin__fentry, struct sk_buff *skb, struct nf_hook_state *state)
{
	if (state->pf != NFPROTO_IPV4_NUM)
		return 0;
	nf_open(0, 0, skb, state);
	return 0;
}

/* only a packet the hook accepted (1): a dropped one's skb is freed by now, a stolen or queued one (0) left
 * between the brackets, and its slot is reclaimed as stale */
SEC("fexit/nf_hook_slow")
int BPF_PROG(nf_end__fexit, struct sk_buff *skb, struct nf_hook_state *state, const void *e, unsigned int i, int ret)
{
	if (ret == 1 && state->pf == NFPROTO_IPV4_NUM)
		nf_close(0, 0, skb, state);
	return 0;
}

#endif /* PATHPROF_NETFILTER_BPF_H */
