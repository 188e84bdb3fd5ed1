// SPDX-License-Identifier: GPL-2.0
/* BPF_PROG_TEST_RUN entry points into the helpers every family of pathprof.bpf.c shares (pp_state.bpf.h,
 * compiled here unchanged): the tracepoint programs that call them cannot be test-run, these can
 * (tests/unit/test_bpf_state.py). Not loaded by pathprof itself. Context: raw_tp arguments, 8 bytes each. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_endian.h>
#include "pathprof.h"
#include "hist.bpf.h"
#include "pp_state.bpf.h"
#include "state_check.h"

char LICENSE[] SEC("license") = "GPL";

/* span(stage, role, leg, hop, ns): one latency span, as a message's pairing records it */
SEC("raw_tp")
int check_span(__u64 *ctx)
{
	span(ctx[0], ctx[1], ctx[2], ctx[3], 0, ctx[4], 0);
	return 0;
}

/* one switch of CPU accounting for a thread of (role, hop): returns 1 when it had a `cpuacc` record */
SEC("raw_tp")
int check_cpu_acc(__u64 *ctx)
{
	struct pp_task t = { .role = ctx[0], .hop = ctx[1] };
	struct pp_cpu_val *a = cpu_acc(&t);
	if (!a)
		return 0;
	a->switches += 1;
	return 1;
}

/* trace_sampled(number): 1 when --trace-sample (trace_every, set at load) takes the transaction numbered ctx[0] */
SEC("raw_tp")
int check_trace_sampled(__u64 *ctx)
{
	return trace_every ? trace_sampled((__u32)ctx[0]) : 0;
}
