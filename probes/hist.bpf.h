/* BPF-side helpers shared by pathprof's objects (static inline only: no maps, no programs). */
#ifndef PATHPROF_HIST_BPF_H
#define PATHPROF_HIST_BPF_H
#include "common.h"

/* log-linear slot: values < 4 map to themselves, then 4 slots per octave (the inverse is
 * pathprof.agent.probing.bpf.layout.slot_bounds) */
static __always_inline __u32 hist_slot(__u64 v)
{
	if (v < 4)
		return v;
	__u32 l = 0;
	__u64 x = v;
	if (x >> 32) { x >>= 32; l += 32; }
	if (x >> 16) { x >>= 16; l += 16; }
	if (x >> 8)  { x >>= 8;  l += 8; }
	if (x >> 4)  { x >>= 4;  l += 4; }
	if (x >> 2)  { x >>= 2;  l += 2; }
	if (x >> 1)  { l += 1; }
	__u32 idx = 4 * (l - 1) + ((v >> (l - 2)) & 3);
	return idx < PP_HIST_SLOTS ? idx : PP_HIST_SLOTS - 1;
}

/* per-CPU histograms only: plain adds, no atomics needed */
static __always_inline void hist_add(struct pp_hist *h, __u64 ns)
{
	h->sum_ns += ns;
	h->count += 1;
	__u32 s = hist_slot(ns);
	if (s < PP_HIST_SLOTS)
		h->slots[s] += 1;
}

/* is `port` one of the run's service ports (a `const volatile` array set before load, 0-terminated)? */
static __always_inline int port_in(const volatile __u16 *ports, __u16 port)
{
#pragma unroll
	for (int i = 0; i < PP_MAX_PORTS; i++) {
		if (!ports[i])
			return 0;
		if (ports[i] == port)
			return 1;
	}
	return 0;
}
#endif
