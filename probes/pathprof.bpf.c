// SPDX-License-Identifier: GPL-2.0
/* pathprof's probes: per-message latency stages, per-role CPU accounting, device hops and netfilter brackets,
 * aggregated in the kernel and filtered to the run's own threads and sockets. Tracepoints (tp_btf), USDT and
 * BPF netfilter links only: this kernel has no kprobes and refuses fentry. The stage model is documented in
 * pathprof.analysis.views; the shared types are in common.h and pathprof.h.
 *
 * Cost is the first design constraint: every event of every process passes through these programs. A
 * tracked thread is one with task-local storage (`tasks`), a known socket one with socket-local storage
 * (`socks`): the early exit for everything else is one storage lookup, and storage goes away with its task
 * or socket (nothing to evict or delete). No hash insert or delete on a per-packet path; clock reads only
 * after the early exits (a clock read costs ~70 ns on the project's VMs). Duty-cycled: all but fork are
 * attached only inside measurement windows (struct pp_win).
 *
 * One file and one object, longer than the others, for a reason: every program here shares the same maps
 * (windows, per-CPU state, aggregates), and libbpf 1.1 can share maps between objects only by fd juggling
 * or the static linker. Sections: configuration and maps, helpers, scheduler, messages, devices, netfilter,
 * the qemu hop, USDT. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_endian.h>
#include <bpf/usdt.bpf.h>
#include "pathprof.h"
#include "hist.bpf.h"

char LICENSE[] SEC("license") = "GPL";

#define MSG_PEEK 2
#define NET_TX_SOFTIRQ 2
#define NET_RX_SOFTIRQ 3
#define IPPROTO_TCP_NUM 6
#define AF_UNIX_NUM 1
#define ETH_P_IP_NUM 0x0800
#define NF_ACCEPT 1
#define DEV_STALE_NS 1000000000ULL     /* a device stamp older than this is not paired */
#define NF_STALE_NS 10000000ULL

/* ---------------- configuration, set before load ---------------- */
const volatile __u16 svc_ports[PP_MAX_PORTS] = {};   /* host order, 0-terminated: the run's service ports */
const volatile __u32 nf_netns[PP_MAX_NETNS] = {};    /* netns inodes of the topology, in slot order */
const volatile __u32 lat_hops = PP_MAX_HOPS;          /* hop slots in `lat` (the run's hops + 1) */
const volatile __u32 nf_nns = 0;                       /* namespaces in nf_netns; slot nf_nns is "other" */
const volatile __u32 trace_every = 0;                 /* --trace-sample N: 1 in N messages per socket */
const volatile __u32 tap_wire = 1;                    /* the path has a qemu guest behind a tap (wire.qemu) */
/* unused: keeps struct pp_trace in the object's BTF for the layout test (the ring buffer has no value type) */
const volatile struct pp_trace pp_trace_layout = {};

/* ---------------- maps ---------------- */
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct pp_task);
} tasks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct pp_sock);
} socks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, PP_DEVQ_SLOTS);
	__type(key, __u32);
	__type(value, struct pp_devq);
} devq SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);   /* max_entries set at load: 6 x 9 x 5 x lat_hops */
	__uint(max_entries, PP_LAT_STAGES * PP_NROLES * PP_NLEGS * PP_MAX_HOPS);
	__type(key, __u32);
	__type(value, struct pp_hist);
} lat SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 1024);
	__type(key, struct pp_stage_key);
	__type(value, struct pp_hist);
} stages SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);   /* max_entries set at load: the run's netns slots x 20 */
	__uint(max_entries, PP_MAX_NETNS * PP_NF_PER_NETNS);
	__type(key, __u32);
	__type(value, struct pp_hist);
} nfagg SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, PP_NF_SLOTS);
	__type(key, __u32);
	__type(value, struct pp_nf_slot);
} nfslot SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);      /* all-zero value to create hist entries (too big for the stack) */
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct pp_hist);
} zero_hist SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);   /* per (role, hop): read at any time, nothing to fold at exit */
	__uint(max_entries, PP_NROLES * PP_MAX_HOPS);
	__type(key, __u32);
	__type(value, struct pp_cpu_val);
} cpuacc SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct pp_cpu_state);
} cpust SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);      /* per CPU id, read across CPUs: when it went idle, 0 = busy */
	__uint(max_entries, 1024);             /* set at load: the possible CPUs */
	__type(key, __u32);
	__type(value, __u64);
} cpu_idle SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, PP_NSTATS);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct pp_win);
} win SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4 << 20);      /* ~130k spans: drained every 100 ms during windows */
} traces SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);   /* qemu hop: client end of a connection -> qemu read its request */
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, __u64);
} guestq SEC(".maps");

/* ---------------- helpers ---------------- */
static __always_inline void stat_add(__u32 idx, __u64 n)
{
	__u64 *v = bpf_map_lookup_elem(&stats, &idx);
	if (v)
		*v += n;
}

static __always_inline void stat_inc(__u32 idx) { stat_add(idx, 1); }

static __always_inline __u64 win_start(void)
{
	__u32 zero = 0;
	struct pp_win *w = bpf_map_lookup_elem(&win, &zero);
	return w ? w->start_ns : 0;
}

static __always_inline int is_svc_port(__u16 port) { return port_in(svc_ports, port); }

/* slot of a netns inode among the topology's; nf_nns = not one of them ("other") */
static __always_inline __u32 netns_slot_of(__u32 ino)
{
#pragma unroll
	for (int i = 0; i < PP_MAX_NETNS - 1; i++) {
		if (i >= nf_nns)
			break;
		if (nf_netns[i] == ino)
			return i;
	}
	return nf_nns;
}

static __always_inline void stage_add(struct pp_stage_key *k, __u64 ns)
{
	struct pp_hist *h = bpf_map_lookup_elem(&stages, k);
	if (!h) {
		__u32 zero = 0;
		struct pp_hist *z = bpf_map_lookup_elem(&zero_hist, &zero);
		if (!z)
			return;
		bpf_map_update_elem(&stages, k, z, BPF_NOEXIST);   /* once per stage key; may race another CPU */
		h = bpf_map_lookup_elem(&stages, k);
		if (!h) {
			stat_inc(PP_STAT_STAGES_FULL);
			return;
		}
	}
	hist_add(h, ns);
}

/* This CPU's state, reset on its first use in window `ws`: nothing ran between windows, so the last switch
 * is taken as the window start and whatever softirq was open is dropped. Whether the task then running is
 * tracked is unknown: cur_tracked = 1 lets the next softirq count it as tracked until the next switch. */
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

/* A task's timestamps are valid only inside the window that set them: on its first use in a new window,
 * whatever it had pending began before the window opened and is discarded -- counted, never silently.
 * oncpu_ts = 0 then means "on CPU since before the window" to sched_switch. */
static __always_inline struct pp_task *task_of(struct task_struct *p, __u64 ws)
{
	struct pp_task *t = bpf_task_storage_get(&tasks, p, 0, 0);
	if (t && t->win != ws) {
		__u64 n = t->in_send + (t->runnable_ts != 0) + (t->consume_ts != 0);
#pragma unroll
		for (int i = 0; i < PP_NUSDT; i++) {
			n += t->usdt_ts[i] != 0;
			t->usdt_ts[i] = 0;
		}
		if (n)
			stat_add(PP_STAT_WINDOW_EDGE, n);
		t->win = ws;
		t->in_send = 0;
		t->send_ts = t->wake_ts = t->oncpu_ts = t->runnable_ts = t->consume_ts = 0;
		t->last_utime = t->last_stime = 0;
	}
	return t;
}

static __always_inline struct pp_task *cur_task(__u64 ws)
{
	return task_of(bpf_get_current_task_btf(), ws);
}

static __always_inline struct pp_cpu_val *cpu_acc(struct pp_task *t)
{
	__u32 idx = (__u32)t->role * PP_MAX_HOPS + (t->hop & (PP_MAX_HOPS - 1));
	return bpf_map_lookup_elem(&cpuacc, &idx);
}

static __always_inline int is_hop_role(__u8 r)
{
	return r == PP_ROLE_POOLER || r == PP_ROLE_PROXY || r == PP_ROLE_QEMU || r == PP_ROLE_OTHER;
}

/* lat_add, plus one span event when the message is sampled. trace_every is a load-time constant: with
 * --trace-sample off the verifier drops this branch entirely. */
static __always_inline void span(__u8 stage, __u8 role, __u8 leg, __u32 hop, __u64 start, __u64 ns, __u32 seq)
{
	__u32 idx = (((__u32)(stage - 1) * PP_NROLES + role) * PP_NLEGS + leg) * lat_hops + (hop & (PP_MAX_HOPS - 1));
	struct pp_hist *h = bpf_map_lookup_elem(&lat, &idx);
	if (h)
		hist_add(h, ns);
	if (!trace_every || !seq || seq % trace_every)
		return;
	struct pp_trace *e = bpf_ringbuf_reserve(&traces, sizeof(*e), 0);
	if (!e) {
		stat_inc(PP_STAT_TRACE_LOST);
		return;
	}
	__u64 id = bpf_get_current_pid_tgid();
	e->ts = start;
	e->dur = ns;
	e->pid = id >> 32;
	e->tid = (__u32)id;
	e->seq = seq;
	e->stage = stage;
	e->role = role;
	e->leg = leg;
	e->hop = hop;
	bpf_ringbuf_submit(e, 0);
	stat_inc(PP_STAT_TRACES);
}

/* IPv4/TCP tuple and payload length of the IP header at p; 0 when not IPv4/TCP.
 * One probe read when the IP header has no options (the common case). */
struct pp_tuple { __u32 saddr, daddr; __u16 sport, dport; __u32 payload; };

static __always_inline int ip_tuple(unsigned char *p, struct pp_tuple *t)
{
	struct { struct iphdr ip; struct tcphdr th; } h;
	if (bpf_probe_read_kernel(&h, sizeof(h), p) || h.ip.version != 4 || h.ip.protocol != IPPROTO_TCP_NUM)
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

static __always_inline struct pp_devq *devq_slot(struct sk_buff *skb)
{
	__u64 a = (__u64)skb;
	__u32 idx = (__u32)((a >> 8) ^ (a >> 20)) & (PP_DEVQ_SLOTS - 1);   /* skbs are 256-byte slab objects */
	return bpf_map_lookup_elem(&devq, &idx);
}

/* the leg of a TCP data skb leaving one of the topology's devices (0: not IPv4/TCP with payload, or not a device
 * of this topology); *netns = the device's namespace. Shared by the device and the qdisc stages. */
static __always_inline __u8 data_skb_leg(struct sk_buff *skb, struct net_device *dev, __u32 *netns)
{
	if (skb->protocol != bpf_htons(ETH_P_IP_NUM))
		return 0;
	*netns = dev->nd_net.net->ns.inum;
	if (netns_slot_of(*netns) >= nf_nns)
		return 0;
	struct pp_tuple tu = {};
	if (!ip_tuple(skb->head + skb->network_header, &tu) || !tu.payload)
		return 0;
	return tuple_leg(&tu);
}

#include "qdisc.bpf.h"   /* link impairments (qdisc, delay line): their own programs and maps */

/* ---------------- scheduler: on-CPU accounting and wakeups ---------------- */
SEC("tp_btf/sched_switch")
int BPF_PROG(pp_sched_switch, bool preempt, struct task_struct *prev, struct task_struct *next,
	     unsigned int prev_state)
{
	__u64 ws = win_start();
	if (!ws)
		return 0;
	struct pp_cpu_state *cs = cpu_state(ws);
	if (!cs)
		return 0;
	__u64 now = bpf_ktime_get_ns();   /* for every switch: untracked tasks' time is the `other` component */
	/* prev is the task this CPU switched in last: whether it was tracked was learnt then (cur_tracked; 1 when
	 * unknown), so untracked switch-outs cost no storage lookup */
	struct pp_task *pt = cs->cur_tracked ? task_of(prev, ws) : 0;
	if (pt) {
		/* switch-in not seen (before the window, or its run was missed): it cannot have been earlier than
		 * the last switch seen on this CPU (the window start at first), so charge from there */
		__u64 on = pt->oncpu_ts ? pt->oncpu_ts : cs->last_switch;
		__u64 snap = pt->oncpu_ts ? pt->excl_snap : cs->excl_at_switch;
		if (!pt->oncpu_ts)
			stat_inc(PP_STAT_SWITCH_IN_UNSEEN);
		__u64 d = now - on, ex = cs->excl_total - snap;
		struct pp_cpu_val *a = cpu_acc(pt);
		__u64 ut = prev->utime, st = prev->stime;
		if (a) {
			a->oncpu_ns += d > ex ? d - ex : 0;
			if (pt->last_utime || pt->last_stime) {
				a->utime_ns += ut - pt->last_utime;
				a->stime_ns += st - pt->last_stime;
			}
			a->switches += 1;
		}
		pt->last_utime = ut;
		pt->last_stime = st;
		pt->oncpu_ts = 0;
		if (preempt || prev_state == 0)
			pt->runnable_ts = now;       /* still runnable: waits on the run queue */
	} else if (prev->pid && cs->last_switch) {
		__u64 d = now - cs->last_switch, ex = cs->excl_total - cs->excl_at_switch;
		cs->other_ns += d > ex ? d - ex : 0;
	}
	cs->last_switch = now;
	cs->excl_at_switch = cs->excl_total;
	__u32 cpu = bpf_get_smp_processor_id();
	__u64 *idle = bpf_map_lookup_elem(&cpu_idle, &cpu);
	if (idle)
		*idle = next->pid == 0 ? now : 0;    /* pid 0: this CPU's idle task */
	struct pp_task *nt = task_of(next, ws);
	cs->cur_tracked = nt != 0;
	if (nt) {
		nt->oncpu_ts = now;
		nt->excl_snap = cs->excl_total;
		__u64 r = __sync_lock_test_and_set(&nt->runnable_ts, 0);   /* a waker on another CPU may write it */
		struct pp_cpu_val *a = r ? cpu_acc(nt) : 0;
		if (a && now > r) {
			a->runq_ns += now - r;
			a->runq_cnt += 1;
		}
	}
	return 0;
}

static __always_inline void on_wakeup(struct task_struct *p)
{
	__u64 ws = win_start();
	if (!ws)
		return;
	struct pp_task *t = task_of(p, ws);
	if (t) {
		__u64 now = bpf_ktime_get_ns();
		t->wake_ts = now;
		t->runnable_ts = now;
		/* woken onto an idle CPU? (a queued wakeup runs on that CPU once it left idle: still idle here) */
		__u32 cpu = BPF_CORE_READ(p, thread_info.cpu);
		__u64 *idle = bpf_map_lookup_elem(&cpu_idle, &cpu);
		t->wake_idle = idle && *idle != 0;
	}
}

SEC("tp_btf/sched_wakeup")
int BPF_PROG(pp_sched_wakeup, struct task_struct *p) { on_wakeup(p); return 0; }

SEC("tp_btf/sched_wakeup_new")
int BPF_PROG(pp_sched_wakeup_new, struct task_struct *p) { on_wakeup(p); return 0; }

/* Always attached (rare, and it keeps the tracked set right between windows): a child of a tracked thread
 * inherits its role; a new process forked by the postmaster is a backend. An exiting thread needs nothing:
 * its CPU time is already in `cpuacc`, and its storage goes away with it. */
SEC("tp_btf/sched_process_fork")
int BPF_PROG(pp_fork, struct task_struct *parent, struct task_struct *child)
{
	struct pp_task *pt = bpf_task_storage_get(&tasks, parent, 0, 0);
	if (!pt)
		return 0;
	struct pp_task n = { .role = pt->role, .hop = pt->hop };
	if (pt->role == PP_ROLE_POSTMASTER && child->tgid != parent->tgid)
		n.role = PP_ROLE_BACKEND;
	if (!bpf_task_storage_get(&tasks, child, &n, BPF_LOCAL_STORAGE_GET_F_CREATE))
		stat_inc(PP_STAT_TASKS_FULL);
	return 0;
}

/* ---------------- NET softirqs: carved out of the task they interrupted ---------------- */
/* this CPU's state when `vec` is a NET softirq inside an open window, else 0 */
static __always_inline struct pp_cpu_state *net_softirq_state(unsigned int vec)
{
	if (vec != NET_RX_SOFTIRQ && vec != NET_TX_SOFTIRQ)
		return 0;
	__u64 ws = win_start();
	return ws ? cpu_state(ws) : 0;
}

SEC("tp_btf/softirq_entry")
int BPF_PROG(pp_softirq_entry, unsigned int vec)
{
	struct pp_cpu_state *cs = net_softirq_state(vec);
	if (cs) {
		cs->softirq_start = bpf_ktime_get_ns();
		cs->nf_in_softirq = 0;
	}
	return 0;
}

SEC("tp_btf/softirq_exit")
int BPF_PROG(pp_softirq_exit, unsigned int vec)
{
	struct pp_cpu_state *cs = net_softirq_state(vec);
	if (!cs || !cs->softirq_start)
		return 0;
	__u64 d = bpf_ktime_get_ns() - cs->softirq_start;
	d = d > cs->nf_in_softirq ? d - cs->nf_in_softirq : 0;   /* netfilter inside was counted already */
	cs->softirq_start = 0;
	cs->excl_total += d;
	__u32 where = cs->cur_tracked ? 0 : ((__u32)bpf_get_current_pid_tgid() == 0 ? 1 : 2);
	if (where < 3)
		cs->softirq_ns[where] += d;
	cs->softirq_cnt += 1;
	return 0;
}

/* --trace-sample: the number a message carries, so every message of one transaction has the same one and the
 * sample (number % trace_every) takes all of them: a client's request opens a new number (its connection's
 * last + 1), a backend answers with the request's, a hop forwards the one it consumed. Per-socket counters
 * alone drift apart whenever a window opens mid-transaction. Only runs with traces on (trace_every != 0). */
static __always_inline __u32 send_number(struct sock *sk, struct pp_task *t)
{
	if (is_hop_role(t->role))
		return t->consume_seq;
	struct pp_sock *s = sk ? bpf_sk_storage_get(&socks, sk, 0, 0) : 0;
	if (!s)
		return 0;
	return t->role == PP_ROLE_PGBENCH ? s->seq + 1 : s->seq;
}

/* ---------------- messages: send -> ready -> consumed -> next send ----------------
 * TCP send start: the first tcp_sendmsg_locked of the send (a few hundred ns after the syscall entry; syscall
 * tracepoints would put every syscall of every process on the slow path). AF_UNIX has no such tracepoint: its
 * send start is taken at the receiver's sk_data_ready. */
SEC("tp_btf/tcp_sendmsg_locked")
int BPF_PROG(pp_tcp_send, const struct sock *sk, const struct msghdr *msg, const struct sk_buff *skb, int goal)
{
	__u64 ws = win_start();
	if (!ws)
		return 0;
	struct pp_task *t = cur_task(ws);
	if (t && !t->in_send) {
		t->send_ts = bpf_ktime_get_ns();
		t->in_send = 1;
		if (trace_every)
			t->send_seq = send_number((struct sock *)sk, t);
		/* a hop sending again with no read since its last send (whose delivery is cont_ts) and no sleep either
		 * goes on working on the same message (pgpool sends a reply's piece to the client, then the next request
		 * to the backend): this send's processing starts where the last one was delivered */
		if (is_hop_role(t->role) && !t->consume_ts && t->cont_ts >= ws && t->wake_ts < t->cont_ts &&
		    t->send_ts > t->cont_ts) {
			t->consume_ts = t->cont_ts;
			stat_inc(PP_STAT_HOP_CONTINUED);
		}
	}
	return 0;
}

/* leg of messages arriving on a socket owned by `role` */
static __always_inline __u8 sock_leg(__u8 role, struct sock *sk)
{
	if (role == PP_ROLE_BACKEND || role == PP_ROLE_POSTMASTER || role == PP_ROLE_PG_AUX)
		return PP_LEG_REQUEST;
	if (role == PP_ROLE_PGBENCH)
		return PP_LEG_RESPONSE;
	return is_svc_port(sk->__sk_common.skc_num) ? PP_LEG_REQUEST : PP_LEG_RESPONSE;
}

static __always_inline __u32 tcp_copied(struct sock *sk)
{
	return BPF_CORE_READ((struct tcp_sock *)sk, copied_seq);
}

/* the socket's storage, created on first use by a tracked thread; 0 for a fresh socket (nothing pending) */
static __always_inline struct pp_sock *learn_sock(struct sock *sk, struct pp_task *t)
{
	struct pp_sock *s = bpf_sk_storage_get(&socks, sk, 0, 0);
	if (s)
		return s;
	struct pp_sock n = { .role = t->role, .hop = t->hop, .leg = sock_leg(t->role, sk) };
	if (sk->sk_protocol == IPPROTO_TCP_NUM)
		n.copied = tcp_copied(sk);
	if (!bpf_sk_storage_get(&socks, sk, &n, BPF_SK_STORAGE_GET_F_CREATE))
		stat_inc(PP_STAT_SOCKS_FULL);
	return 0;
}

SEC("tp_btf/sk_data_ready")
int BPF_PROG(pp_sk_data_ready, const struct sock *csk)
{
	__u64 ws = win_start();
	if (!ws)
		return 0;
	struct sock *sk = (struct sock *)csk;
	struct pp_sock *s = bpf_sk_storage_get(&socks, sk, 0, 0);
	if (!s) {
		if (cur_task(ws))
			stat_inc(PP_STAT_READY_UNLEARNED);
		return 0;
	}
	__u64 old = s->ready_ts;
	/* queue not drained: the same message continues. A hop's wait starts at its first piece; a request/response
	 * receiver (pgbench, a backend) waits for the whole message, so its wait starts at the last piece: a pooler
	 * that forwards a reply in parts between its own round trips upstream (pgpool) would otherwise have the
	 * receiver's wakeup overlap all of that upstream work. The piece keeps its wire stage: it is on the path. */
	int more = old >= ws;
	if (more && is_hop_role(s->role))
		return 0;
	__u64 now = bpf_ktime_get_ns();
	if (__sync_val_compare_and_swap(&s->ready_ts, old, now) != old) {
		stat_inc(PP_STAT_READY_RACE);   /* another CPU marked it first: that one is the message's start */
		return 0;
	}
	if (old && !more)
		stat_inc(PP_STAT_WINDOW_EDGE);   /* left pending by an earlier window */
	stat_inc(more ? PP_STAT_PIECE_LATE : PP_STAT_MESSAGES);
	/* loopback/veth/unix: delivery runs inside the sender's send, so current = sender, and in_send tells it
	 * apart from a receiver draining its socket backlog inside recv */
	struct pp_task *t = cur_task(ws);
	__u32 seq = more ? s->seq : ++s->seq;   /* only the cmpxchg winner writes it; a further piece keeps it */
	if (!more && trace_every && t) {  /* the sender's transaction number, where the sender is known */
		int is_unix = sk->__sk_common.skc_family == AF_UNIX_NUM;
		if (is_unix && !t->in_send) { /* AF_UNIX: its send starts here; the sender's socket is the peer */
			struct unix_sock *u = bpf_skc_to_unix_sock(sk);
			t->send_seq = u && u->peer ? send_number(u->peer, t) : 0;
		}
		if ((t->in_send || is_unix) && t->send_seq)
			s->seq = seq = t->send_seq;
	}
	__u64 qs = qdisc_on ? qdisc_send_start(ws) : 0;   /* out of a netem qdisc: sent from elsewhere, earlier */
	if (qs && now > qs) {
		span(PP_ST_WIRE, s->role, s->leg, s->hop, qs, now - qs, seq);
	} else if (t && t->in_send && now > t->send_ts) {
		span(PP_ST_WIRE, s->role, s->leg, s->hop, t->send_ts, now - t->send_ts, seq);
		if (t->role == PP_ROLE_QEMU)
			t->in_send = 0;           /* a tap write has no sock_send_length (pp_tap_recv) */
		t->cont_ts = now;             /* a hop's next send without a read in between continues from here */
	} else if (t && !t->in_send && sk->__sk_common.skc_family == AF_UNIX_NUM) {
		t->send_ts = now;             /* unix: the send path up to here stays in the sender's stage */
		t->in_send = 1;
		stat_inc(PP_STAT_WIRE_UNTIMED);
	} else {
		stat_inc(PP_STAT_WIRE_UNPAIRED);
	}
	return 0;
}

/* the ready -> consumed stages of one piece: woken (onto an idle or a busy CPU), run queue, receive; or queued
 * when the receiver was already awake (w = 0) */
static __always_inline void piece_spans(struct pp_sock *s, __u64 r, __u64 w, __u64 on, __u64 done, __u8 idle,
					__u32 seq)
{
	if (w) {
		span(idle ? PP_ST_IDLE_EXIT : PP_ST_WAKEUP, s->role, s->leg, s->hop, r, w - r, seq);
		span(PP_ST_RUNQUEUE, s->role, s->leg, s->hop, w, on - w, seq);
		span(PP_ST_RECV, s->role, s->leg, s->hop, on, done - on, seq);
	} else {
		span(PP_ST_QUEUED, s->role, s->leg, s->hop, r, done - r, seq);
	}
}

/* t consumed the message pending on sk: close its ready -> consumed stages (wakeup, runqueue, recv, or queued)
 * and remember the consume for the processing that follows -- on the socket for request/response roles, on
 * the thread for hops. A hop (pgbouncer, a pgpool child, docker-proxy, qemu) consumes on one socket and
 * forwards on another, so its processing pairs a send with the most recent consume by the same thread that no
 * send has claimed yet: an event loop forwards what it read before it reads the next; Go's docker-proxy copies
 * each direction in one goroutine (splice in, splice out, back to back on one thread). */
static __always_inline void on_consume(struct sock *sk, struct pp_task *t, __u64 ws, int tcp)
{
	struct pp_sock *s = learn_sock(sk, t);
	if (!s)
		return;
	if (tcp) {
		__u32 c = tcp_copied(sk);
		if (c == s->copied)
			return;                   /* nothing was moved */
		s->copied = c;
	}
	__u64 r = __sync_lock_test_and_set(&s->ready_ts, 0), now = bpf_ktime_get_ns();
	if (r && r < ws) {
		stat_inc(PP_STAT_WINDOW_EDGE);  /* became ready before the window: its wait is not whole */
		r = 0;
	}
	if (r && now >= r) {
		__u64 w = t->wake_ts, on = t->oncpu_ts >= w ? t->oncpu_ts : w;
		if (!(w > r && w <= now))
			w = on = 0;               /* already awake: the message was queued behind other work */
		if (is_hop_role(t->role)) {
			piece_spans(s, r, w, on, now, t->wake_idle, s->seq);
		} else {                      /* kept until the receiver answers: only the last piece counts */
			if (s->pend_done)
				stat_inc(PP_STAT_PIECE_SUPERSEDED);
			s->pend_ready = r;
			s->pend_wake = w;
			s->pend_oncpu = on;
			s->pend_done = now;
			s->pend_seq = s->seq;
			s->pend_idle = t->wake_idle;
		}
	}
	if (is_hop_role(t->role)) {
		t->consume_ts = now;
		t->consume_leg = s->leg;
		t->consume_seq = s->seq;
	} else {
		s->consume_ts = now;
	}
}

SEC("tp_btf/sock_recv_length")
int BPF_PROG(pp_sock_recv, struct sock *sk, int ret, int flags)
{
	if (ret <= 0 || (flags & MSG_PEEK))
		return 0;
	__u64 ws = win_start();
	if (!ws)
		return 0;
	struct pp_task *t = cur_task(ws);
	if (!t || (is_hop_role(t->role) && sk->sk_protocol == IPPROTO_TCP_NUM))
		return 0;                     /* a hop's TCP consumes: pp_tcp_consume */
	on_consume(sk, t, ws, 0);
	return 0;
}

/* A hop's TCP consume: tcp_rcv_space_adjust runs after both tcp_recvmsg and tcp_read_sock (splice(2), Go's
 * io.Copy between two TCPConns) moved data, where sock_recv_length fires for recvmsg only. A call that moved
 * nothing leaves copied_seq as it was and is not a consume. Attached only when a hop is tracked. */
SEC("tp_btf/tcp_rcv_space_adjust")
int BPF_PROG(pp_tcp_consume, struct sock *sk)
{
	__u64 ws = win_start();
	if (!ws)
		return 0;
	struct pp_task *t = cur_task(ws);
	if (t && is_hop_role(t->role))
		on_consume(sk, t, ws, 1);
	return 0;
}

SEC("tp_btf/sock_send_length")
int BPF_PROG(pp_sock_send, struct sock *sk, int ret, int flags)
{
	__u64 ws = win_start();
	if (!ws)
		return 0;
	struct pp_task *t = cur_task(ws);
	if (!t)
		return 0;
	int was_sending = t->in_send;
	t->in_send = 0;                   /* the send is over, whatever its outcome */
	if (ret <= 0 || !was_sending)
		return 0;
	struct pp_sock *s = learn_sock(sk, t);
	__u64 start = 0;
	__u32 seq = 0;
	__u8 leg = 0;
	if (is_hop_role(t->role)) {       /* forwards this thread's last unforwarded consume */
		start = t->consume_ts;
		leg = t->consume_leg;
		seq = t->consume_seq;
		t->consume_ts = 0;
	} else if (s) {                   /* request/response on the same connection (backend, pgbench) */
		if (s->pend_done) {           /* the reply it answers: its last piece's wait */
			if (s->pend_ready >= ws)
				piece_spans(s, s->pend_ready, s->pend_wake, s->pend_oncpu, s->pend_done, s->pend_idle,
					    s->pend_seq);
			s->pend_done = 0;
		}
		start = __sync_lock_test_and_set(&s->consume_ts, 0);
		seq = s->seq;
		leg = t->role == PP_ROLE_PGBENCH ? PP_LEG_CLIENT : PP_LEG_SERVER;
		if (start && start < ws) {
			stat_inc(PP_STAT_WINDOW_EDGE);   /* consumed before the window opened */
			return 0;
		}
	}
	if (start && t->send_ts > start)
		span(PP_ST_PROC, t->role, leg, t->hop, start, t->send_ts - start, seq);
	else if (!start)
		stat_inc(PP_STAT_PROC_UNPAIRED);
	return 0;
}

/* ---------------- device hops: xmit -> receive of the same data skb ---------------- */
SEC("tp_btf/net_dev_start_xmit")
int BPF_PROG(pp_dev_xmit, struct sk_buff *skb, struct net_device *dev)
{
	__u64 ws = win_start();
	if (!ws)
		return 0;
	__u32 netns = 0;
	__u8 leg = data_skb_leg(skb, dev, &netns);
	struct pp_devq *q = leg ? devq_slot(skb) : 0;
	if (!q)
		return 0;
	if (q->skb && q->skb != (__u64)skb && q->ts >= ws)
		stat_inc(PP_STAT_DEV_OVERWRITTEN);
	struct pp_task *t = tap_wire ? cur_task(ws) : 0;  /* only a tap's reader (qemu) uses the send start */
	q->send_ts = t && t->in_send ? t->send_ts : 0;     /* a tap: wire.qemu starts there */
	q->head = (__u64)skb->head;
	q->ifindex = dev->ifindex;
	q->netns = netns;
	q->leg = leg;
	q->ts = bpf_ktime_get_ns();
	q->skb = (__u64)skb;
	return 0;
}

/* the devq entry of skb, or 0; a reused skb address with another data buffer is stale (counted, freed) */
static __always_inline struct pp_devq *devq_match(struct sk_buff *skb)
{
	struct pp_devq *q = devq_slot(skb);
	if (!q || q->skb != (__u64)skb)
		return 0;
	if (q->head != (__u64)skb->head) {
		stat_inc(PP_STAT_DEV_STALE);
		q->skb = 0;
		return 0;
	}
	return q;
}

SEC("tp_btf/netif_receive_skb")
int BPF_PROG(pp_dev_recv, struct sk_buff *skb)
{
	__u64 ws = win_start();
	if (!ws)
		return 0;
	struct pp_devq *q = devq_match(skb);
	if (!q)
		return 0;
	__u64 now = bpf_ktime_get_ns(), ts = q->ts;
	q->skb = 0;
	if (ts < ws) {
		stat_inc(PP_STAT_WINDOW_EDGE);
	} else if (now - ts > DEV_STALE_NS) {
		stat_inc(PP_STAT_DEV_STALE);
	} else {
		struct pp_stage_key k = { .stage = PP_ST_DEV, .leg = q->leg, .hop = q->ifindex, .netns = q->netns };
		stage_add(&k, now - ts);
	}
	return 0;
}

/* ---------------- netfilter brackets ----------------
 * nf_begin is linked at priority INT_MIN+1 and nf_end at INT_MAX-1 on the IPv4 hooks that have functions
 * registered in a namespace of the topology (the front end lists them), so the time between them is what the
 * hook's other functions (iptables/nftables chains, conntrack, NAT) cost that packet. Only the run's packets
 * (TCP to/from a service port) are timed. nf_begin reads the clock last and nf_end first, so the brackets'
 * own work stays outside. Conntrack confirm runs at INT_MAX, after nf_end, and is not included. In every
 * IPv4 hook skb->data is the IP header. Program type/attach type are set by the loader (libbpf 1.1 predates
 * them). */
SEC("netfilter")
int nf_begin(struct bpf_nf_ctx *ctx)
{
	__u64 ws = win_start();
	if (!ws)
		return NF_ACCEPT;
	struct sk_buff *skb = ctx->skb;
	struct pp_tuple tu = {};
	if (!ip_tuple(skb->data, &tu))
		return NF_ACCEPT;
	__u8 leg = tuple_leg(&tu);
	__u32 hook = ctx->state->hook;
	if (!leg || hook >= 5)
		return NF_ACCEPT;
	struct pp_nf_slot *s = bpf_map_lookup_elem(&nfslot, &hook);
	if (s && s->skb && s->ts < ws) {
		stat_inc(PP_STAT_WINDOW_EDGE);    /* parked in an earlier window */
		s->skb = 0;
	}
	if (s && s->skb && bpf_ktime_get_ns() - s->ts > NF_STALE_NS) {
		stat_inc(PP_STAT_NF_UNPAIRED);    /* stale: that packet left between the brackets (stolen/dropped) */
		s->skb = 0;
	}
	if (s && s->skb) {                /* nested traversal of the same hook (softirq inside process) */
		__u32 nested = hook + 5;
		s = bpf_map_lookup_elem(&nfslot, &nested);
		if (s && s->skb) {
			stat_inc(PP_STAT_NF_NESTED);  /* a third one, or a preempted traversal: not timed */
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
	s->ts = bpf_ktime_get_ns();
	return NF_ACCEPT;
}

SEC("netfilter")
int nf_end(struct bpf_nf_ctx *ctx)
{
	__u64 ws = win_start();
	if (!ws)
		return NF_ACCEPT;
	__u32 hook = ctx->state->hook;
	if (hook >= 5)
		return NF_ACCEPT;
	__u64 skb = (__u64)ctx->skb;
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
	__u64 d = now - s->ts;
	struct pp_tuple tu = {};
	if (ip_tuple(ctx->skb->data, &tu) && (tu.saddr != s->saddr || tu.daddr != s->daddr ||
					 tu.sport != s->sport || tu.dport != s->dport))
		stat_inc(PP_STAT_NF_NAT);
	stat_inc(PP_STAT_NF_PKTS);
	__u32 idx = ((netns_slot_of(BPF_CORE_READ(ctx->state, net, ns.inum)) * 5 + hook) * 2 +
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
	struct pp_cpu_state *cs = cpu_state(ws);
	if (cs) {
		cs->nf_ns += d;
		cs->excl_total += d;
		if (cs->softirq_start)
			cs->nf_in_softirq += d;
	}
	return NF_ACCEPT;
}

/* ---------------- a qemu guest behind a tap: qemu (with the guest it runs) is the hop ----------------
 * The guest's kernel is invisible. Request: the data skb's net_dev_start_xmit on the tap (pp_dev_xmit keeps the
 * tracked sender's send start) -> qemu reads it from the tap fd (tun consumes the skb in qemu's context):
 * wire.<qemu> from the send to the read, with dev.<tap> inside it. Then hop.<qemu> on the server leg (qemu +
 * guest kernel + guest server) until qemu writes the response to the tap (its first netif_receive_skb, in
 * qemu's context), which starts the response's wire. qemu's reads and writes of the tap may be on different
 * threads: the hop's start is kept per connection (guestq, keyed by the client's end). Both programs are
 * attached only when a qemu hop is tracked. */
static __always_inline __u64 conn_key(__u32 addr, __u16 port) { return ((__u64)addr << 16) | port; }

SEC("tp_btf/consume_skb")
int BPF_PROG(pp_tap_read, struct sk_buff *skb, void *location)
{
	__u64 ws = win_start();
	if (!ws)
		return 0;
	struct pp_devq *q = devq_match(skb);
	if (!q)
		return 0;
	q->skb = 0;                       /* the skb is freed: its address will be reused */
	struct pp_task *t = cur_task(ws);
	if (t && t->role == PP_ROLE_QEMU && q->ts >= ws) {
		__u64 now = bpf_ktime_get_ns();
		if (q->send_ts >= ws && q->ts > q->send_ts)
			span(PP_ST_WIRE, PP_ROLE_QEMU, q->leg, t->hop, q->send_ts, now - q->send_ts, 0);
		struct pp_stage_key k = { .stage = PP_ST_DEV, .leg = q->leg, .hop = q->ifindex, .netns = q->netns };
		stage_add(&k, now - q->ts);
		struct pp_tuple tu = {};
		if (q->leg == PP_LEG_REQUEST && ip_tuple(skb->head + skb->network_header, &tu)) {
			__u64 c = conn_key(tu.saddr, tu.sport);
			bpf_map_update_elem(&guestq, &c, &now, BPF_ANY);
		}
	} else if (t && q->ts < ws) {
		stat_inc(PP_STAT_WINDOW_EDGE);
	}
	return 0;
}

SEC("tp_btf/netif_receive_skb")
int BPF_PROG(pp_tap_recv, struct sk_buff *skb)
{
	if (skb->protocol != bpf_htons(ETH_P_IP_NUM) || skb->skb_iif)
		return 0;                     /* skb_iif: not the first device receive of this skb (bridge) */
	__u64 ws = win_start();
	if (!ws)
		return 0;
	struct pp_task *t = cur_task(ws);
	if (!t || t->role != PP_ROLE_QEMU)
		return 0;
	struct pp_tuple tu = {};
	if (!ip_tuple(skb->data, &tu) || !tu.payload || tuple_leg(&tu) != PP_LEG_RESPONSE)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	__u64 c = conn_key(tu.daddr, tu.dport), *start = bpf_map_lookup_elem(&guestq, &c);
	if (start && *start >= ws && now > *start) {
		span(PP_ST_PROC, PP_ROLE_QEMU, PP_LEG_SERVER, t->hop, *start, now - *start, 0);
		bpf_map_delete_elem(&guestq, &c);
	} else {
		stat_inc(PP_STAT_PROC_UNPAIRED);   /* a second segment of the response, or begun before the window */
	}
	t->send_ts = now;                 /* the response's wire: delivery runs inside this write */
	t->in_send = 1;
	return 0;
}

/* ---------------- block devices: the disk's own time ----------------
 * Every request completed inside the window (the machine's, not only the run's: writeback and journal
 * commits happen in kernel threads on behalf of everyone), timed from the issue stamp the block layer keeps
 * (io_start_time_ns, else the request's allocation, start_time_ns; both ktime_get_ns like ours): no state of
 * our own. */
SEC("tp_btf/block_rq_complete")
int BPF_PROG(pp_block_done, struct request *rq, blk_status_t error, unsigned int nr_bytes)
{
	__u64 ws = win_start();
	if (!ws)
		return 0;
	__u64 start = rq->io_start_time_ns ? rq->io_start_time_ns : rq->start_time_ns;
	if (start < ws)
		return 0;                     /* issued before the window (or not stamped) */
	__u64 now = bpf_ktime_get_ns();
	if (now <= start)
		return 0;
	struct block_device *bd = rq->part;
	struct gendisk *gd = rq->q ? rq->q->disk : 0;   /* a flush has no partition: name the disk */
	__u32 dev = bd ? bd->bd_dev : (gd ? ((__u32)gd->major << 20) | gd->first_minor : 0);
	struct pp_stage_key k = { .stage = PP_ST_BLOCK, .sub = rq->cmd_flags & 0xff /* REQ_OP_MASK */, .hop = dev };
	stage_add(&k, now - start);
	return 0;
}

/* ---------------- PostgreSQL USDT (--probes deep) ---------------- */
/* Exclusive time. The waits and I/O nest (a commit's XLogFlush waits for WALWriteLock, an LWLock wait; writing
 * a dirty buffer first flushes the WAL up to its LSN), so their inclusive times overlap and cannot be summed.
 * Every boundary of one of them charges the time since the previous boundary to the span that owned it:
 * the outermost open I/O span (wal_flush, dirty_write, wal_full: the waits inside are part of that I/O), else
 * the innermost open wait (lock, lwlock, data_read). Usdt indices below; a span is open while usdt_ts[i] != 0. */
#define PP_U_LOCK 4
#define PP_U_LWLOCK 5
#define PP_U_WAL_FLUSH 6
#define PP_U_DATA_READ 8
#define PP_U_DIRTY_WRITE 9
#define PP_U_WAL_FULL 10

static __always_inline int is_excl(int i)
{
	return i == PP_U_LOCK || i == PP_U_LWLOCK || i == PP_U_WAL_FLUSH || i == PP_U_DATA_READ ||
	       i == PP_U_DIRTY_WRITE || i == PP_U_WAL_FULL;
}

static __always_inline int excl_owner(struct pp_task *t)
{
	int owner = -1;
	__u64 best = ~0ULL;
	const int io[3] = { PP_U_WAL_FLUSH, PP_U_DIRTY_WRITE, PP_U_WAL_FULL };
	const int waits[3] = { PP_U_LOCK, PP_U_LWLOCK, PP_U_DATA_READ };
#pragma unroll
	for (int j = 0; j < 3; j++) {
		__u64 ts = t->usdt_ts[io[j]];
		if (ts && ts < best) {
			best = ts;
			owner = io[j];
		}
	}
	if (owner >= 0)
		return owner;
	best = 0;
#pragma unroll
	for (int j = 0; j < 3; j++) {
		__u64 ts = t->usdt_ts[waits[j]];
		if (ts > best) {
			best = ts;
			owner = waits[j];
		}
	}
	return owner;
}

static __always_inline void excl_boundary(struct pp_task *t, __u64 now)
{
	int owner = excl_owner(t);
	if (owner >= 0 && t->io_mark && now > t->io_mark) {
		struct pp_stage_key k = { .stage = PP_ST_PG_EXCL, .role = t->role, .leg = PP_LEG_SERVER,
					  .sub = (__u8)owner, .hop = t->hop };
		stage_add(&k, now - t->io_mark);
	}
	t->io_mark = now;
}

static __always_inline int usdt_mark(int i, int done, __u8 stage)
{
	__u64 ws = win_start();
	if (!ws)
		return 0;
	struct pp_task *t = cur_task(ws);
	if (!t || i < 0 || i >= PP_NUSDT)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	if (is_excl(i))
		excl_boundary(t, now);
	if (!done) {
		t->usdt_ts[i] = now;
	} else if (t->usdt_ts[i]) {
		struct pp_stage_key k = { .stage = stage, .role = t->role, .leg = PP_LEG_SERVER, .hop = t->hop };
		stage_add(&k, now - t->usdt_ts[i]);
		t->usdt_ts[i] = 0;
	}
	return 0;
}

#define PG_PAIR(name, i, stage) \
	SEC("usdt") int BPF_USDT(pg_##name##_start) { return usdt_mark(i, 0, stage); } \
	SEC("usdt") int BPF_USDT(pg_##name##_done) { return usdt_mark(i, 1, stage); }

PG_PAIR(query, 0, PP_ST_PG_QUERY)
PG_PAIR(parse, 1, PP_ST_PG_PARSE)
PG_PAIR(plan, 2, PP_ST_PG_PLAN)
PG_PAIR(execute, 3, PP_ST_PG_EXECUTE)
PG_PAIR(lock, 4, PP_ST_PG_LOCK)
PG_PAIR(lwlock, 5, PP_ST_PG_LWLOCK)
PG_PAIR(data_read, 8, PP_ST_PG_DATA_READ)
PG_PAIR(dirty_write, 9, PP_ST_PG_DIRTY_WRITE)
PG_PAIR(wal_full, 10, PP_ST_PG_WAL_FULL)

/* functions without a USDT pair: entry and return uprobes (exported symbols of the postgres binary) */
#define PG_CALL(name, i, stage) \
	SEC("uprobe") int BPF_KPROBE(pg_##name##_start) { return usdt_mark(i, 0, stage); } \
	SEC("uretprobe") int BPF_KRETPROBE(pg_##name##_done) { return usdt_mark(i, 1, stage); }

PG_CALL(wal_flush, 6, PP_ST_PG_WAL_FLUSH)
