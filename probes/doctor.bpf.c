// SPDX-License-Identifier: GPL-2.0
/* Used by `pathprof doctor` only: each program proves that one attach type loads and attaches here. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/usdt.bpf.h>
#include "doctor.h"

char LICENSE[] SEC("license") = "GPL";

struct pp_doctor_hits hits = {};

SEC("tp_btf/sched_wakeup_new")
int BPF_PROG(dr_tp_btf, struct task_struct *p) { __sync_fetch_and_add(&hits.hits, 1); return 0; }

SEC("raw_tp/sched_wakeup_new")
int dr_raw_tp(void *ctx) { __sync_fetch_and_add(&hits.hits, 1); return 0; }

SEC("tracepoint/sched/sched_wakeup_new")
int dr_tracepoint(void *ctx) { __sync_fetch_and_add(&hits.hits, 1); return 0; }

SEC("usdt")
int BPF_USDT(dr_usdt) { __sync_fetch_and_add(&hits.hits, 1); return 0; }

SEC("netfilter")
int dr_netfilter(struct bpf_nf_ctx *ctx) { return 1; /* NF_ACCEPT */ }

/* fentry/kprobe: the fallbacks of events whose tracepoint a kernel lacks (pathprof.agent.probing.hooks); tried on a
 * function every kernel has. Some kernels list the function in BTF and still refuse fentry (this project's 6.18). */
SEC("fentry/sock_def_readable")
int BPF_PROG(dr_fentry, struct sock *sk) { __sync_fetch_and_add(&hits.hits, 1); return 0; }

SEC("kprobe/sock_def_readable")
int BPF_KPROBE(dr_kprobe) { __sync_fetch_and_add(&hits.hits, 1); return 0; }
