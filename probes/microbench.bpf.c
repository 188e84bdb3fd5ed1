// SPDX-License-Identifier: GPL-2.0
/* The floor of a probe on this machine (bench/bpf_helpers): one tp_btf program per variant, each attached alone
 * to sys_enter while user space loops over getppid(2), so the kernel's own per-program statistics
 * (run_time_ns / run_cnt) give what a program body, a clock read, a storage lookup or a field read costs here,
 * with the machine's mitigations and the stats' own two clock reads included (subtract `empty`). Not loaded by
 * pathprof itself. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "microbench.h"

char LICENSE[] SEC("license") = "GPL";

const volatile __u32 target_tgid = 0;

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, __u64);
} mb_task SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} mb_pcpu SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, __u64);
} mb_hash SEC(".maps");

__u64 sink = 0;   /* results land here so the verifier and clang keep the work */

SEC("tp_btf/sys_enter")
int BPF_PROG(mb_empty, struct pt_regs *regs, long id) { return 0; }

SEC("tp_btf/sys_enter")
int BPF_PROG(mb_pid_filter, struct pt_regs *regs, long id)
{
	return (bpf_get_current_pid_tgid() >> 32) == target_tgid;
}

SEC("tp_btf/sys_enter")
int BPF_PROG(mb_clock, struct pt_regs *regs, long id)
{
	sink += bpf_ktime_get_ns();
	return 0;
}

SEC("tp_btf/sys_enter")
int BPF_PROG(mb_task_storage, struct pt_regs *regs, long id)
{
	__u64 *v = bpf_task_storage_get(&mb_task, bpf_get_current_task_btf(), 0, 0);
	if (v)
		sink += *v;
	return 0;
}

SEC("tp_btf/sys_enter")
int BPF_PROG(mb_percpu_add, struct pt_regs *regs, long id)
{
	__u32 k = 0;
	__u64 *v = bpf_map_lookup_elem(&mb_pcpu, &k);
	if (v)
		*v += 1;
	return 0;
}

SEC("tp_btf/sys_enter")
int BPF_PROG(mb_hash_lookup, struct pt_regs *regs, long id)
{
	__u32 k = (__u32)id;
	__u64 *v = bpf_map_lookup_elem(&mb_hash, &k);
	if (v)
		sink += *v;
	return 0;
}

/* a timestamp the kernel already keeps: the scheduler's last arrival on a CPU (a load, no helper call) */
SEC("tp_btf/sys_enter")
int BPF_PROG(mb_field_read, struct pt_regs *regs, long id)
{
	struct task_struct *t = bpf_get_current_task_btf();
	sink += t->sched_info.last_arrival;
	return 0;
}

/* 40 bytes copied by bpf_probe_read_kernel (how ip_tuple read headers before issue #20's third round) */
SEC("tp_btf/sys_enter")
int BPF_PROG(mb_probe_read, struct pt_regs *regs, long id)
{
	struct { __u64 w[5]; } buf;
	if (!bpf_probe_read_kernel(&buf, sizeof(buf), regs))
		sink += buf.w[0] + buf.w[4];
	return 0;
}

/* the same fields as plain loads through a read-only typed pointer (bpf_rdonly_cast, inlined by the verifier) */
extern void *bpf_rdonly_cast(const void *obj, __u32 btf_id) __ksym;

SEC("tp_btf/sys_enter")
int BPF_PROG(mb_kcast_read, struct pt_regs *regs, long id)
{
	struct pt_regs *r = bpf_rdonly_cast((const void *)(unsigned long)regs, bpf_core_type_id_kernel(struct pt_regs));
	sink += r->r15 + r->bp;
	return 0;
}

/* a call to a global (non-inlined) function: what moving a cold branch out of a program costs per call; such a
 * function is verified once on its own instead of once per path into it */
__noinline __u64 mb_callee(__u64 x)
{
	return x * 3 + 1;
}

SEC("tp_btf/sys_enter")
int BPF_PROG(mb_subprog_call, struct pt_regs *regs, long id)
{
	sink += mb_callee((__u64)id);
	return 0;
}
