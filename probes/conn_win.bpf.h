/* The setup steps charged by their overlap with the measurement windows (issue #22).
 *
 * The latency view's cycle is the clients' time inside the windows over the transactions that ended inside them
 * (pathprof.analysis.windows, in_windows.client_s). For the setup steps to tile that cycle they must describe the
 * same stretch of time: each step of *every* connection of the run (pgbench's start on) is charged with the part
 * of it that fell inside a window. Sampling only the connections that started inside a window left out the part
 * of a wait that began before the window opened: pgpool's listen queue overflowing at pgbench's start (1-3 s SYN
 * retransmission waits running into the first window), replies that became ready just before a window opened.
 *
 * The front end (pathprof.agent.probing.conn) keeps the last PC_WIN_RING windows in `win_ring`, the open one
 * ending at U64_MAX: a step ends after its start, so when it is charged every window it overlaps is known.
 * The histogram keeps each step's whole length (its count: every connection of the run), the sum the part in the
 * windows; the analysis divides the sum by the transactions inside the windows. Part of conn.bpf.c, included
 * after its maps and step helpers. */
#ifndef PATHPROF_CONN_WIN_BPF_H
#define PATHPROF_CONN_WIN_BPF_H

#define PC_WIN_RING 16          /* 16 windows of the default 4 s period: a minute, longer than any setup step */

struct pc_win_ring {
	__u64 start[PC_WIN_RING];   /* CLOCK_MONOTONIC ns; 0 = unused slot */
	__u64 end[PC_WIN_RING];     /* U64_MAX while the window is open */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct pc_win_ring);
} win_ring SEC(".maps");

/* the part of [a, b) inside the measurement windows. A global function, verified once on its own (a call costs
 * ~1.3 ns here, bench/bpf_helpers): inlined into each step's charge, its loop's branches were walked again at
 * every call site (pc_send: 312k verified instructions, ~0.17 s of a --connect run's set-up) */
__noinline __u64 win_overlap(__u64 a, __u64 b)
{
	__u32 zero = 0;
	struct pc_win_ring *r = bpf_map_lookup_elem(&win_ring, &zero);
	__u64 sum = 0;
	if (!r || b <= a)
		return 0;
	for (int i = 0; i < PC_WIN_RING; i++) {
		__u64 s = r->start[i], e = r->end[i];
		if (!s)
			continue;
		if (s < a)
			s = a;
		if (e > b)
			e = b;
		if (e > s)
			sum += e - s;
	}
	return sum;
}

/* step a -> b of any connection: its whole length into the histogram, its part inside the windows into the sum */
static __always_inline void step_charge(__u32 step, __u64 a, __u64 b)
{
	if (!a || !b)
		return;
	struct pp_hist *h = bpf_map_lookup_elem(&conn_agg, &step);
	if (!h)
		return;
	__u64 ns = 0;
	if (b < a)
		cstat(PC_STAT_ORDER);
	else
		ns = b - a;
	h->count += 1;
	h->sum_ns += win_overlap(a, b);
	__u32 s = hist_slot(ns);
	if (s < PP_HIST_SLOTS)
		h->slots[s] += 1;
}

/* an aggregate (`n` waiting over [a, b)): its part inside the windows */
static __always_inline void total_charge(__u32 step, __u64 n, __u64 a, __u64 b)
{
	__u64 ns = n * win_overlap(a, b);
	if (!ns)
		return;
	struct pp_hist *h = bpf_map_lookup_elem(&conn_agg, &step);
	if (h) {
		h->sum_ns += ns;
		h->count += 1;
	}
}

#endif /* PATHPROF_CONN_WIN_BPF_H */
