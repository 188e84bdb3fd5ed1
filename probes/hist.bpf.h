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

/* Atomic read-modify-writes that return the old value: fetch-add, xchg, cmpxchg (BPF_ATOMIC | BPF_FETCH, the v3
 * instruction set, Linux >= 5.12). An object for an older kernel (-DPP_NO_FETCH_ATOMICS: pathprof-510.bpf.o,
 * conn-510.bpf.o) has only BPF_XADD, an add whose result is not returned (an unused __sync_fetch_and_add compiles
 * to it), so these become a load and a store: what they arbitrated between two CPUs is then arbitrated by nothing.
 * Each caller says what that gives up; pp_cas counts what it can still see: after its store it reads the value
 * back, and another CPU's store in between makes it fail as a lost compare-and-swap does (both CPUs can still
 * pass when their loads and stores interleave one by one). On one CPU nothing changes. */
#ifndef PP_NO_FETCH_ATOMICS
#define pp_fetch_add(p, v) __sync_fetch_and_add(p, v)
#define pp_xchg(p, v) __sync_lock_test_and_set(p, v)
#define pp_cas(p, old, new) __sync_val_compare_and_swap(p, old, new)
#else
#define PP_ONCE(p) (*(volatile __typeof__(*(p)) *)(p))
#define pp_fetch_add(p, v) ({ __typeof__(*(p)) __o = PP_ONCE(p); PP_ONCE(p) = __o + (v); __o; })
#define pp_xchg(p, v) ({ __typeof__(*(p)) __o = PP_ONCE(p); PP_ONCE(p) = (v); __o; })
#define pp_cas(p, old, new) ({ __typeof__(*(p)) __o = PP_ONCE(p), __n = (new); \
	if (__o == (old)) { PP_ONCE(p) = __n; if (PP_ONCE(p) != __n) __o = ~(__typeof__(*(p)))(old); } __o; })
#endif

/* sched_switch's arguments and the CPU of a task. -DPP_PRE_518 (the objects for old kernels): before Linux 5.18 the
 * tracepoint has no prev_state argument, so the state prev leaves its CPU in is read from prev itself (`__state`
 * from 5.14, `state` before), which is what __schedule passed as prev_state once it had let a thread with a signal
 * pending run on; before 5.16 a task's CPU is task_struct.cpu, not thread_info.cpu. Only that object reads them
 * this way (the others' code stays as it was). */
#ifdef PP_PRE_518
struct task_struct___pre514 { volatile long state; } __attribute__((preserve_access_index));
struct task_struct___pre516 { unsigned int cpu; } __attribute__((preserve_access_index));
#define PP_SWITCH_ARGS bool preempt, struct task_struct *prev, struct task_struct *next
#define PP_PREV_STATE ((unsigned int)(bpf_core_field_exists(prev->__state) ? prev->__state : \
	((struct task_struct___pre514 *)prev)->state))
#define pp_task_cpu(p) (bpf_core_field_exists((p)->thread_info.cpu) ? (p)->thread_info.cpu : \
	((struct task_struct___pre516 *)(p))->cpu)
#else
#define PP_SWITCH_ARGS bool preempt, struct task_struct *prev, struct task_struct *next, unsigned int prev_state
#define PP_PREV_STATE prev_state
#define pp_task_cpu(p) ((p)->thread_info.cpu)
#endif

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
