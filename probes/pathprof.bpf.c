// SPDX-License-Identifier: GPL-2.0
/* pathprof's probes: per-message latency stages, per-role CPU accounting, device hops and netfilter brackets,
 * aggregated in the kernel and filtered to the run's own threads and sockets. Tracepoints (tp_btf), USDT and
 * BPF netfilter links only: this kernel has no kprobes and refuses fentry. The stage model is documented in
 * pathprof.analysis.stages; the shared types are in common.h and pathprof.h.
 *
 * Cost is the first design constraint: every event of every process passes through these programs. A
 * tracked thread is one with task-local storage (`tasks`), a known socket one with socket-local storage
 * (`socks`): the early exit for everything else is one storage lookup, and storage goes away with its task
 * or socket (nothing to evict or delete). No hash insert or delete on a per-packet path; clock reads only
 * after the early exits (a clock read costs ~70 ns on the project's VMs). Duty-cycled: all but fork are
 * attached only inside measurement windows (struct pp_win).
 *
 * One object for every family, for a reason: every program shares the same maps (windows, per-CPU state,
 * aggregates), and libbpf 1.1 can share maps between objects only by fd juggling or the static linker. So
 * each family lives in a header of its own (one concern per file, as libbpf-tools keeps them), included
 * here in dependency order: state and helpers first, then the program families. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_endian.h>
#include <bpf/usdt.bpf.h>
#include "pathprof.h"
#include "hist.bpf.h"

char LICENSE[] SEC("license") = "GPL";

/* Referenced only so clang puts the enums and the limits into this object's BTF: user space builds its name
 * tables, limits and struct mirrors from that BTF (gen_abi.py -> abi.json at build time), never from a
 * hand-written copy. A limit travels as the length of an array (#defines are not in BTF). */
const volatile struct pp_abi_anchor {
	enum pp_role role; enum pp_leg leg; enum pp_stage stage; enum pp_stat stat;
	__u8 max_ports[PP_MAX_PORTS], max_netns[PP_MAX_NETNS], max_hops[PP_MAX_HOPS], lat_stages[PP_LAT_STAGES];
	__u8 nroles[PP_NROLES], nlegs[PP_NLEGS], nf_per_netns[PP_NF_PER_NETNS];
} pp_abi_anchor = {};

#include "pp_state.bpf.h"   /* configuration, maps, shared helpers */
#include "qdisc.bpf.h"      /* link impairments (qdisc, delay line): their own programs and maps */
#include "sched.bpf.h"      /* scheduler and NET softirqs */
#include "holdq.bpf.h"      /* requests a hop holds (pooler waits) */
#include "tcp_loss.bpf.h"   /* TCP retransmissions: the recovery wait of a lost message */
#include "relay.bpf.h"      /* replies a hop relays in parts */
#include "stall.bpf.h"      /* messages in pieces: streamed results, full windows */
#include "msg.bpf.h"        /* messages on sockets */
#include "dev.bpf.h"        /* device hops */
#include "netfilter.bpf.h"  /* netfilter brackets */
#include "guest.bpf.h"      /* the qemu hop */
#include "block.bpf.h"      /* block devices */
#include "pg_usdt.bpf.h"    /* PostgreSQL USDT */
