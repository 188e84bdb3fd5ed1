/* Shared layout of pathprof's aggregate maps: included by every *.bpf.c and mirrored field for field
 * by pathprof.agent.bpf.layout (ctypes). tests/unit/test_bpf_layout.py checks the sizes against the
 * BTF that clang puts into the .bpf.o, so a change here that is not mirrored fails a test.
 * Fixed-width types only: the same bytes are read by Python. */
#ifndef PATHPROF_COMMON_H
#define PATHPROF_COMMON_H

#define PP_HIST_SLOTS 128   /* log-linear: 4 sub-buckets per power of two, 0 ns .. 2^32 ns */
#define PP_MAX_PORTS  8
#define PP_DEVNAME    16

enum pp_role {              /* who a tracked thread is; the front end names them */
	PP_ROLE_NONE = 0, PP_ROLE_PGBENCH = 1, PP_ROLE_BACKEND = 2, PP_ROLE_POSTMASTER = 3,
	PP_ROLE_PG_AUX = 4, PP_ROLE_POOLER = 5, PP_ROLE_PROXY = 6, PP_ROLE_QEMU = 7, PP_ROLE_OTHER = 8,
};

enum pp_leg { PP_LEG_NONE = 0, PP_LEG_REQUEST = 1, PP_LEG_SERVER = 2, PP_LEG_RESPONSE = 3, PP_LEG_CLIENT = 4 };

enum pp_stage {
	/* hot latency stages: a per-CPU array indexed by pp_lat_index() (no hashing on the hot path) */
	PP_ST_WIRE = 1,        /* start of the sender's send -> sk_data_ready on the receiving socket */
	PP_ST_WAKEUP = 2,      /* sk_data_ready -> receiver's sched_wakeup */
	PP_ST_RUNQUEUE = 3,    /* wakeup -> switched onto a CPU */
	PP_ST_RECV = 4,        /* on CPU -> consuming receive returned data */
	PP_ST_QUEUED = 5,      /* receiver was already awake: ready -> consumed (busy with other work) */
	PP_ST_PROC = 6,        /* consuming receive -> next send syscall entry (backend/hop/client work) */
	/* rarer ones: the `stages` per-CPU hash */
	PP_ST_DEV = 8,         /* net_dev_start_xmit -> netif_receive_skb of the same data skb (hop = ifindex) */
	PP_ST_PG_QUERY = 12,   /* USDT (deep): query__start/done and the phases below */
	PP_ST_PG_PARSE = 13, PP_ST_PG_PLAN = 14, PP_ST_PG_EXECUTE = 15,
	PP_ST_PG_LOCK = 16, PP_ST_PG_LWLOCK = 17,
};
#define PP_NUSDT 6

/* lat array geometry: stage (6) x role (9) x leg (5) x hop slot (8) */
#define PP_LAT_STAGES 6
#define PP_NROLES     9
#define PP_NLEGS      5
#define PP_MAX_HOPS   8
#define PP_LAT_N      (PP_LAT_STAGES * PP_NROLES * PP_NLEGS * PP_MAX_HOPS)

/* netfilter array geometry: netns slot (8) x hook (5) x leg (2) x {all packets, data segments} */
#define PP_MAX_NETNS  8
#define PP_NF_N       (PP_MAX_NETNS * 5 * 2 * 2)

enum pp_cpu_comp { PP_CPU_ONCPU = 1 };   /* `cpu` hash: per-role totals flushed by exiting threads */

enum pp_stat {              /* per-CPU counters of everything not aggregated, so nothing is dropped silently */
	PP_STAT_TASKS_FULL = 0, PP_STAT_SOCKS_FULL = 1, PP_STAT_STAGES_FULL = 2, PP_STAT_CPU_FULL = 3,
	PP_STAT_WIRE_UNPAIRED = 4, PP_STAT_READY_UNLEARNED = 5, PP_STAT_NF_UNPAIRED = 6, PP_STAT_NF_NESTED = 7,
	PP_STAT_NF_NAT = 8, PP_STAT_DEV_FULL = 9, PP_STAT_MESSAGES = 10, PP_STAT_NF_PKTS = 11,
	PP_STAT_PROC_UNPAIRED = 12, PP_STAT_HOP_OVERFLOW = 13, PP_STAT_WIRE_UNTIMED = 14,
	PP_STAT_WINDOW_EDGE = 15,   /* pairings begun before the current window opened: discarded */
	PP_STAT_TRACE_LOST = 16, PP_STAT_TRACES = 17,   /* --trace-sample spans not / emitted (ring buffer full) */
	PP_NSTATS = 20,
};

struct pp_stage_key {       /* key of the `stages` hash (dev, USDT) */
	__u8  stage;            /* enum pp_stage */
	__u8  role;
	__u8  leg;              /* enum pp_leg */
	__u8  sub;
	__u32 hop;              /* hop id; ifindex for PP_ST_DEV */
	__u32 netns;            /* netns inode for PP_ST_DEV */
	__u32 pad;
};

struct pp_hist {
	__u64 sum_ns;
	__u64 count;
	__u64 slots[PP_HIST_SLOTS];
};

struct pp_cpu_key { __u8 comp; __u8 role; __u8 pad[2]; __u32 hop; };

struct pp_cpu_val {         /* also the accumulators inside pp_task */
	__u64 oncpu_ns;         /* on-CPU, minus NET softirq and netfilter time that ran inside the thread */
	__u64 utime_ns;         /* tick-sampled user/system time (task->utime/stime deltas): the split ratio */
	__u64 stime_ns;
	__u64 runq_ns;          /* wakeup/preemption -> switch-in */
	__u64 runq_cnt;
	__u64 switches;
};

struct pp_cpu_state {       /* per CPU */
	__u64 last_switch;      /* last sched_switch on this CPU */
	__u64 excl_at_switch;   /* excl_total then */
	__u64 excl_total;       /* softirq + netfilter ns carved out of whatever task they ran inside */
	__u64 softirq_start;    /* non-zero while a NET softirq runs */
	__u64 nf_in_softirq;    /* netfilter ns inside the running softirq (not carved twice) */
	__u64 other_ns;         /* on-CPU ns of untracked non-idle tasks */
	__u64 softirq_ns[3];    /* NET softirq ns by where it ran: tracked task, idle, other task */
	__u64 softirq_cnt;
	__u64 nf_ns;            /* all netfilter bracket ns (run packets) */
	__u64 cur_tracked;      /* the running task is tracked (set at switch-in) */
	__u64 win;              /* window (its start) this CPU's state belongs to: reset lazily on change */
	__u64 excl_win0;        /* excl_total when this CPU first ran a program in the window */
};

/* Measurement window. The detailed programs are attached only inside windows (duty cycle: zero cost
 * between them), so every timestamp kept in a map may be from an earlier window. User space writes
 * start_ns = CLOCK_MONOTONIC (= bpf_ktime_get_ns) *after* attaching, and 0 before detaching; a program
 * that sees 0 does nothing, and anything stamped before start_ns is discarded (PP_STAT_WINDOW_EDGE). */
struct pp_win { __u64 start_ns; };

struct pp_trace {           /* one span of a sampled message (--trace-sample), streamed by ring buffer */
	__u64 ts;               /* start, CLOCK_MONOTONIC ns */
	__u64 dur;
	__u32 pid, tid;         /* the thread in whose context the span was closed */
	__u32 seq;              /* per-socket message number: spans of one message share it */
	__u8  stage, role, leg, hop;
};

#ifdef __BPF__   /* ---- BPF side: the maps both objects share (the front end reuses the fds) ---- */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 1024);
	__type(key, struct pp_stage_key);
	__type(value, struct pp_hist);
} stages SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, PP_LAT_N);
	__type(key, __u32);
	__type(value, struct pp_hist);
} lat SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, PP_NF_N);
	__type(key, __u32);
	__type(value, struct pp_hist);
} nfagg SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);      /* all-zero value to create hist entries (too big for the stack) */
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct pp_hist);
} zero_hist SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, struct pp_cpu_key);
	__type(value, struct pp_cpu_val);
} cpu SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct pp_cpu_state);
} cpust SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, PP_NSTATS);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);      /* shared by both objects (fd reused): one switch for all */
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct pp_win);
} win SEC(".maps");

const volatile __u16 svc_ports[PP_MAX_PORTS] = {};   /* host order; the run's service ports */
const volatile __u32 nf_netns[PP_MAX_NETNS] = {};    /* netns inodes of the topology, in slot order */

/* slot of a netns inode among the topology's; PP_MAX_NETNS-1 = not one of them */
static __always_inline __u32 netns_slot_of(__u32 ino)
{
#pragma unroll
	for (int i = 0; i < PP_MAX_NETNS - 1; i++)
		if (nf_netns[i] && nf_netns[i] == ino)
			return i;
	return PP_MAX_NETNS - 1;
}

static __always_inline void stat_add(__u32 idx, __u64 n)
{
	__u64 *v = bpf_map_lookup_elem(&stats, &idx);
	if (v)
		*v += n;
}

static __always_inline void stat_inc(__u32 idx) { stat_add(idx, 1); }

/* start of the open window, 0 when closed (an array lookup with a constant key is inlined) */
static __always_inline __u64 win_start(void)
{
	__u32 zero = 0;
	struct pp_win *w = bpf_map_lookup_elem(&win, &zero);
	return w ? w->start_ns : 0;
}

static __always_inline int is_svc_port(__u16 port)
{
#pragma unroll
	for (int i = 0; i < PP_MAX_PORTS; i++)
		if (svc_ports[i] && svc_ports[i] == port)
			return 1;
	return 0;
}

/* log-linear slot: values < 4 map to themselves, then 4 slots per octave */
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

static __always_inline void hist_add(struct pp_hist *h, __u64 ns)
{
	h->sum_ns += ns;
	h->count += 1;
	__u32 s = hist_slot(ns);
	if (s < PP_HIST_SLOTS)
		h->slots[s] += 1;
}

static __always_inline void stage_add(struct pp_stage_key *k, __u64 ns)
{
	struct pp_hist *h = bpf_map_lookup_elem(&stages, k);
	if (!h) {
		__u32 zero = 0;
		struct pp_hist *z = bpf_map_lookup_elem(&zero_hist, &zero);
		if (!z)
			return;
		bpf_map_update_elem(&stages, k, z, BPF_NOEXIST);   /* may race another CPU: fine */
		h = bpf_map_lookup_elem(&stages, k);
		if (!h) {
			stat_inc(PP_STAT_STAGES_FULL);
			return;
		}
	}
	hist_add(h, ns);
}

/* This CPU's state, reset on its first use in window `ws`: nothing ran between windows, so the last
 * switch is taken as the window start (the task then running has run since before it: every switch
 * after it is seen) and whatever softirq was open is dropped. Whether that task is tracked is unknown:
 * cur_tracked = 1 makes the next sched_switch look it up. */
static __always_inline struct pp_cpu_state *cpu_state(__u64 ws)
{
	__u32 zero = 0;
	struct pp_cpu_state *cs = bpf_map_lookup_elem(&cpust, &zero);
	if (cs && cs->win != ws) {
		cs->win = ws;
		cs->last_switch = ws;
		cs->excl_at_switch = cs->excl_total;
		cs->excl_win0 = cs->excl_total;
		cs->softirq_start = 0;
		cs->nf_in_softirq = 0;
		cs->cur_tracked = 1;
	}
	return cs;
}

/* IPv4/TCP tuple and payload length of the IP header at p; 0 when not IPv4/TCP.
 * One probe read when the IP header has no options (the common case). */
struct pp_tuple { __u32 saddr, daddr; __u16 sport, dport; __u32 payload; };

static __always_inline int ip_tuple(unsigned char *p, struct pp_tuple *t)
{
	struct { struct iphdr ip; struct tcphdr th; } h;
	if (bpf_probe_read_kernel(&h, sizeof(h), p) || h.ip.version != 4 || h.ip.protocol != IPPROTO_TCP)
		return 0;
	__u32 ihl = h.ip.ihl * 4;
	if (ihl != sizeof(struct iphdr) && bpf_probe_read_kernel(&h.th, sizeof(h.th), p + ihl))
		return 0;
	t->saddr = h.ip.saddr;
	t->daddr = h.ip.daddr;
	t->sport = bpf_ntohs(h.th.source);
	t->dport = bpf_ntohs(h.th.dest);
	__u32 tot = bpf_ntohs(h.ip.tot_len), hl = ihl + h.th.doff * 4;
	t->payload = tot > hl ? tot - hl : 0;
	return 1;
}

static __always_inline __u8 tuple_leg(struct pp_tuple *t)
{
	if (is_svc_port(t->dport))
		return PP_LEG_REQUEST;
	if (is_svc_port(t->sport))
		return PP_LEG_RESPONSE;
	return PP_LEG_NONE;
}
#endif /* __BPF__ */
#endif
