// SPDX-License-Identifier: GPL-2.0
/* Netfilter brackets: nf_begin is linked at priority INT_MIN+1 and nf_end at INT_MAX-1 on every IPv4
 * hook of every namespace of the topology, so the time between them is what the hook's other
 * functions (iptables/nftables chains, conntrack, NAT) cost that packet. Only the run's packets
 * (TCP to/from a service port) are timed. nf_begin reads the clock last and nf_end first, so the
 * brackets' own work stays outside the window. Conntrack confirm runs at INT_MAX, after nf_end, and
 * is not included. In every IPv4 hook skb->data is the IP header. Program type/attach type are set by the loader (libbpf 1.1 predates them). */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_endian.h>
#include "nf.h"

char LICENSE[] SEC("license") = "GPL";

#define NF_ACCEPT 1

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, PP_NF_SLOTS);
	__type(key, __u32);
	__type(value, struct pp_nf_slot);
} nfslot SEC(".maps");

static __always_inline __u32 netns_slot(const struct nf_hook_state *st)
{
	return netns_slot_of(BPF_CORE_READ(st, net, ns.inum));   /* test runs have no netns: "other" */
}

SEC("netfilter")
int nf_begin(struct bpf_nf_ctx *ctx)
{
	__u64 ws = win_start();         /* outside windows these links are not even attached */
	if (!ws)
		return NF_ACCEPT;
	struct sk_buff *skb = ctx->skb;
	struct pp_tuple tu = {};
	if (!ip_tuple(skb->data, &tu))
		return NF_ACCEPT;
	__u8 leg = tuple_leg(&tu);
	if (!leg)
		return NF_ACCEPT;
	__u32 hook = ctx->state->hook;
	if (hook >= 5)
		return NF_ACCEPT;
	struct pp_nf_slot *s = bpf_map_lookup_elem(&nfslot, &hook);
	if (s && s->skb && s->ts < ws) {
		stat_inc(PP_STAT_WINDOW_EDGE);    /* parked in an earlier window */
		s->skb = 0;
	}
	if (s && s->skb && bpf_ktime_get_ns() - s->ts > 10000000ULL) {
		stat_inc(PP_STAT_NF_UNPAIRED);    /* stale: that packet left between the brackets (stolen/dropped) */
		s->skb = 0;
	}
	if (s && s->skb) {                /* nested traversal of the same hook (softirq inside process) */
		__u32 nested = hook + 5;
		s = bpf_map_lookup_elem(&nfslot, &nested);
		if (s && s->skb)
			stat_inc(PP_STAT_NF_NESTED);
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
	__u64 now = bpf_ktime_get_ns();
	__u32 hook = ctx->state->hook;
	if (hook >= 5)
		return NF_ACCEPT;
	__u64 skb = (__u64)ctx->skb;
	__u32 nested = hook + 5;
	struct pp_nf_slot *s = bpf_map_lookup_elem(&nfslot, &nested);
	if (!s || s->skb != skb) {
		s = bpf_map_lookup_elem(&nfslot, &hook);
		if (!s || s->skb != skb) {
			return NF_ACCEPT;     /* not one of ours (ours always have a slot) */
		}
	}
	if (s->ts < ws) {                 /* bracket opened before the window: not a whole traversal */
		s->skb = 0;
		stat_inc(PP_STAT_WINDOW_EDGE);
		return NF_ACCEPT;
	}
	__u64 d = now - s->ts;
	struct pp_tuple tu = {};
	if (ip_tuple(ctx->skb->data, &tu) && (tu.saddr != s->saddr || tu.daddr != s->daddr ||
					 tu.sport != s->sport || tu.dport != s->dport))
		stat_inc(PP_STAT_NF_NAT);
	stat_inc(PP_STAT_NF_PKTS);
	__u32 idx = ((netns_slot(ctx->state) * 5 + hook) * 2 + (s->leg == PP_LEG_RESPONSE)) * 2;
	struct pp_hist *h = bpf_map_lookup_elem(&nfagg, &idx);
	if (h)
		hist_add(h, d);
	if (s->data) {
		idx += 1;
		h = bpf_map_lookup_elem(&nfagg, &idx);
		if (h)
			hist_add(h, d);
	}
	s->skb = 0;
	struct pp_cpu_state *cs = cpu_state(ws);
	if (cs) {
		cs->nf_ns += d;
		cs->excl_total += d;
		if (cs->softirq_start)
			cs->nf_in_softirq += d;
	}
	return NF_ACCEPT;
}
