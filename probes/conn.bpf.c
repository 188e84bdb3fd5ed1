// SPDX-License-Identifier: GPL-2.0
/* Connection setup under pgbench -C, one new backend per connection: where the 2-3 ms go between the
 * client's connect() and the ReadyForQuery it waits for, and what tearing the backend down costs.
 *
 * A separate object from pathprof.bpf.c (loaded only for --connect runs) so the per-message probes stay
 * untouched. Filtering: the postmaster pid and the service ports are `const volatile`; clients are the
 * threads the front end puts into `who` (pgbench, its threads followed at fork); backends enter `who`
 * only when the postmaster forks right after an accept(). Nothing else on the machine is recorded.
 *
 * accept()/waitpid()/connect() are uprobes on libc bound to one process, not syscall tracepoints:
 * enabling any syscall tracepoint sets the syscall-work flag on every task of the machine (every
 * syscall of every process then takes the slow path), which other engineers' runs would pay for.
 *
 * Pairing a backend with its client: the backend's ReadyForQuery send wakes the *client's* socket
 * (sk_data_ready runs in the backend's context: unix delivery, and loopback TCP's softirq), so that
 * socket pointer finds the `pending` entry the client created at SYN_SENT (TCP) or at its first send
 * after a unix connect(). When the hello wakes no client socket inside the send (a delay line holds it, NAT
 * changes the ports), the server's initial sequence number, known to both ends, finds it (conn_syn.bpf.h).
 * Every interval ends up keyed by step id in `conn_agg` (pp_hist, common.h).
 *
 * Measurement windows: the setup steps of every connection are charged with their overlap with the windows
 * (conn_win.bpf.h), so they describe the same stretch of the run as the cycle they tile. The front end also writes
 * pathprof.bpf.c's window start into `win`: the CPU and off-path figures (cpu.*, first_query, teardown, reap) are
 * of the connections that started inside an open window, however long they then take. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_endian.h>
#include "conn.h"
#include "hist.bpf.h"

char LICENSE[] SEC("license") = "GPL";

#define AF_UNIX 1
#define AF_INET 2
#define AF_INET6 10
#define MSG_PEEK 2
#define TASK_DEAD 0x80
#define TCP_ESTABLISHED 1
#define TCP_SYN_SENT 2
#define TCP_SYN_RECV 3

const volatile __u32 pm_pid = 0;       /* the server process that accepts and forks (postmaster) */
const volatile __u16 svc_ports[PP_MAX_PORTS] = {};   /* host order, 0-terminated: the run's service ports */
const volatile __u16 hop_ports[PP_MAX_PORTS] = {};   /* the service ports a hop listens on (not the postmaster) */
const volatile __u32 max_closed = 0;   /* clients per pgbench thread (0: unknown): at most that many wait for it */

/* the path's network namespaces (inode numbers), 0-terminated; none given: every namespace. The service ports
 * alone match another PostgreSQL or pooler of the machine (a container's, another run's) on the same port */
const volatile __u32 path_netns[PP_MAX_NETNS] = {};

static __always_inline int is_svc_port(__u16 port) { return port_in(svc_ports, port); }

static __always_inline int in_path_netns(const struct sock *sk)
{
	if (!path_netns[0])
		return 1;
	__u32 ino = BPF_CORE_READ(sk, __sk_common.skc_net.net, ns.inum);
#pragma unroll
	for (int i = 0; i < PP_MAX_NETNS; i++) {
		if (!path_netns[i])
			break;
		if (path_netns[i] == ino)
			return 1;
	}
	return 0;
}

__u64 pm_accept_ts = 0;                /* last accept() return not yet followed by its fork */
__u64 pm_on_ts = 0;                    /* postmaster switched in (single-threaded: one slot) */

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct pc_task);
} who SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);     /* the open measurement window's start (CLOCK_MONOTONIC ns), 0 = closed */
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} win SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);   /* failed connects never match: LRU bounds them */
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, struct pc_pending);
} pending SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);   /* a hop's connections ESTABLISHED in a window, not read yet */
	__uint(max_entries, 4096);
	__type(key, __u64);                    /* the hop's struct sock * */
	__type(value, __u64);                  /* ESTABLISHED */
} hop_est SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, PC_NSTEPS);
	__type(key, __u32);
	__type(value, struct pp_hist);
} conn_agg SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, PC_NSTATS);
	__type(key, __u32);
	__type(value, __u64);
} conn_stats SEC(".maps");

struct {
	/* per CPU: is the running task in `who`? Set at switch-in, so the machine-wide hot events (every
	 * send, receive, data-ready and switch-out of every process) cost an array load, not a hash lookup */
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} cur_tracked SEC(".maps");

static __always_inline __u64 *tracked_flag(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&cur_tracked, &zero);
}

static __always_inline __u64 win_start(void)
{
	__u32 zero = 0;
	__u64 *w = bpf_map_lookup_elem(&win, &zero);
	return w ? *w : 0;
}

/* a connection that started at `start` is sampled: inside the window open now */
static __always_inline int in_window(__u64 start)
{
	__u64 ws = win_start();
	return ws && start >= ws;
}

static __always_inline void cstat(__u32 idx)
{
	__u64 *v = bpf_map_lookup_elem(&conn_stats, &idx);
	if (v)
		*v += 1;
}

static __always_inline void step_ns(__u32 step, __u64 ns)
{
	struct pp_hist *h = bpf_map_lookup_elem(&conn_agg, &step);
	if (h)
		hist_add(h, ns);
}

/* interval a -> b; skipped when either end was not seen, clamped (and counted) when out of order */
static __always_inline void step_span(__u32 step, __u64 a, __u64 b)
{
	if (!a || !b)
		return;
	if (b < a) {
		cstat(PC_STAT_ORDER);
		step_ns(step, 0);
		return;
	}
	step_ns(step, b - a);
}

#include "conn_win.bpf.h"      /* the setup steps' overlap with the windows: step_charge, total_charge */

/* the task is current (on CPU): close its on-CPU stint into the old bucket, continue in bucket b */
static __always_inline void rebucket(struct pc_task *t, __u64 now, __u8 b)
{
	__u64 old = t->bucket;
	/* mask in asm: clang drops a C mask where it knows the bucket (e.g. 3 or 4), the verifier does not */
	asm volatile("%0 &= 7" : "+r"(old));
	if (t->on_ts) {
		t->cpu[old] += now - t->on_ts;
		t->on_ts = now;
	}
	t->bucket = b;
}

static __always_inline struct pc_task *current_task(__u32 *tid)
{
	*tid = (__u32)bpf_get_current_pid_tgid();
	return bpf_map_lookup_elem(&who, tid);
}

/* the same, after the per-CPU pre-filter (for the hot, machine-wide events) */
static __always_inline struct pc_task *current_tracked(__u32 *tid)
{
	__u64 *f = tracked_flag();
	if (!f || !*f)
		return 0;
	return current_task(tid);
}

/* the backend's own connection socket: unix, or TCP with a service port as the local port */
static __always_inline int own_conn_sock(struct sock *sk)
{
	__u16 fam = sk->__sk_common.skc_family;
	return fam == AF_UNIX || ((fam == AF_INET || fam == AF_INET6) && is_svc_port(sk->__sk_common.skc_num));
}

/* a client's socket to the server: unix, or TCP with a service port as the remote port */
static __always_inline int client_conn_sock(const struct sock *sk)
{
	__u16 fam = sk->__sk_common.skc_family;
	return fam == AF_UNIX ||
	       ((fam == AF_INET || fam == AF_INET6) && is_svc_port(bpf_ntohs(sk->__sk_common.skc_dport)));
}

/* The thread's clients waiting to be reconnected: closed_n changes by `delta` now. Their waiting time inside the
 * windows is added as it accrues (closed_n x time since the last change), so each client's wait is counted
 * without knowing which connect is whose: pgbench serves its other clients before it reconnects this one. */
static __always_inline void closed_change(struct pc_task *c, __u64 now, int delta)
{
	if (c->closed_n && c->close_ts)
		total_charge(PC_ST_THREAD_WAIT, c->closed_n, c->close_ts, now);
	c->close_ts = now;
	if (delta > 0 && (!max_closed || c->closed_n < max_closed))
		c->closed_n += 1;                /* a close whose reconnect was missed must not count forever */
	else if (c->closed_n)
		c->closed_n -= 1;     /* its first connect (none closed before) leaves it at 0 */
}

/* pgbench connects a thread's clients one after the other at its start (libpq's connect blocks the thread): the
 * k-th waited from the thread's first connect to its own, in no connection's steps but in its cycle. A first connect
 * is one before any of the thread's clients closed, at most max_closed of them */
static __always_inline void first_connect_wait(struct pc_task *c, __u64 now)
{
	if (!c->first_ts)
		c->first_ts = now;
	else if (!c->closed_once && (!max_closed || c->starts_n < max_closed))
		total_charge(PC_ST_THREAD_WAIT, 1, c->first_ts, now);
	if (c->starts_n < 0xffffffffu)
		c->starts_n += 1;
}

static __always_inline void client_start(struct pc_task *c, __u64 now)
{
	first_connect_wait(c, now);
	closed_change(c, now, -1);
	if (c->pend_key) {
		/* the thread's last connection is set up (libpq's connect blocks the thread): its start, if never
		 * paired (a hop or NAT in between), must not pair a later socket at the same address */
		if (!bpf_map_delete_elem(&pending, &c->pend_key))
			cstat(PC_STAT_STALE);
		c->pend_key = 0;
	}
	rebucket(c, now, PC_B_IDLE);
	c->hello = 0;
	c->sampled = in_window(now);
	c->cpu[PC_B_INIT] = 0;
	c->bucket = PC_B_INIT;          /* on-CPU from here to ReadyForQuery received = the client's connect CPU */
	c->start_ts = now;
	c->ready_ts = 0;
	cstat(PC_STAT_STARTS);
}

static __always_inline void delivered(struct pc_task *c, __u64 ready, __u64 at)
{
	step_charge(PC_ST_DELIVERY, ready, at);
	step_charge(PC_ST_TOTAL, c->start_ts, at);
	if (c->sampled)
		step_ns(PC_ST_CPU_CLIENT, c->cpu[PC_B_INIT]);
	c->ready_ts = 0;
}

#include "conn_syn.bpf.h"       /* SYN and SYN-ACK retransmits: connect.syn_retx, connect.synack_retx */

/* ---------------- scheduler: first run, on-CPU buckets, the dead backend leaving ---------------- */
static __always_inline void finish(struct pc_task *t, __u32 tid, __u64 now, int reaping)
{
	/* gone (final switch-out) and reaped (waitpid) race on two CPUs: the second one closes the record.
	 * conn-510.bpf.o (no fetch-add, hist.bpf.h): two CPUs at once may both see 0: the record is then not closed
	 * (its reap step missing, its entry left to the map's bound) */
	if (pp_fetch_add(&t->fin, 1) != 1)
		return;
	if (t->sampled)
		step_ns(PC_ST_REAP, reaping && now > t->gone_ts ? now - t->gone_ts : 0);
	bpf_map_delete_elem(&who, &tid);
}

SEC("tp_btf/sched_switch")
int BPF_PROG(pc_switch, PP_SWITCH_ARGS)
{
	__u64 *f = tracked_flag();
	if (!f)
		return 0;
	__u32 ptid = prev->pid, ntid = next->pid;
	struct pc_task *p = *f ? bpf_map_lookup_elem(&who, &ptid) : 0;
	struct pc_task *n = bpf_map_lookup_elem(&who, &ntid);
	*f = n != 0;
	int pm_prev = pm_pid && ptid == pm_pid, pm_next = pm_pid && ntid == pm_pid;
	__u64 now = 0;                  /* read the clock only for our tasks: not for nearly every switch */
	if (pm_prev || p)
		now = bpf_ktime_get_ns();
	if (pm_prev) {
		if (pm_on_ts && in_window(pm_on_ts)) {
			__u32 k = PC_ST_CPU_PM;
			struct pp_hist *h = bpf_map_lookup_elem(&conn_agg, &k);
			if (h) {
				h->sum_ns += now - pm_on_ts;
				h->count += 1;
			}
		}
		pm_on_ts = 0;
	} else if (p) {
		rebucket(p, now, p->bucket);
		p->on_ts = 0;
		if (p->role == PC_ROLE_BACKEND && ((PP_PREV_STATE & TASK_DEAD) || prev->exit_state)) {
			p->gone_ts = now;
			if (!p->ready_ts) {
				cstat(PC_STAT_GONE_UNREADY);
			} else if (p->sampled) {
				step_span(PC_ST_TEARDOWN, p->recv_ts, now);
				step_ns(PC_ST_CPU_EXIT, p->cpu[PC_B_TAIL]);
				step_ns(PC_ST_CPU_BACKEND, p->cpu[0] + p->cpu[1] + p->cpu[2] + p->cpu[3] + p->cpu[4]);
			}
			finish(p, ptid, now, 0);
		}
	}
	if ((pm_next || n) && !now)
		now = bpf_ktime_get_ns();
	if (pm_next) {
		pm_on_ts = now;
	} else if (n) {
		n->on_ts = now;
		if (n->role == PC_ROLE_BACKEND && !n->first_run_ts)
			n->first_run_ts = now;
	}
	return 0;
}

SEC("tp_btf/sched_process_fork")
int BPF_PROG(pc_fork, struct task_struct *parent, struct task_struct *child)
{
	__u32 ptid = parent->pid, ctid = child->pid;
	if (ptid == pm_pid) {
		/* only a fork that follows an accept() is a connection backend (not autovacuum, bgworkers) */
		if (child->tgid == parent->tgid || !pm_accept_ts)
			return 0;
		__u64 now = bpf_ktime_get_ns();
		struct pc_task n = { .role = PC_ROLE_BACKEND, .bucket = PC_B_INIT, .accept_ts = pm_accept_ts,
				     .fork_ts = now, .fork_win = in_window(now) };
		pm_accept_ts = 0;
		cstat(PC_STAT_FORKS);
		if (bpf_map_update_elem(&who, &ctid, &n, BPF_ANY))
			cstat(PC_STAT_TASKS_FULL);
		return 0;
	}
	struct pc_task *p = bpf_map_lookup_elem(&who, &ptid);
	if (p && p->role == PC_ROLE_CLIENT) {           /* pgbench's worker threads */
		struct pc_task n = { .role = PC_ROLE_CLIENT, .bucket = PC_B_IDLE };
		if (bpf_map_update_elem(&who, &ctid, &n, BPF_ANY))
			cstat(PC_STAT_TASKS_FULL);
	}
	return 0;
}

/* ---------------- client side: connection start ---------------- */
SEC("tp_btf/inet_sock_set_state")
int BPF_PROG(pc_tcp_state, const struct sock *sk, const int oldstate, const int newstate)
{
	__u64 key = (__u64)sk;
	if (newstate == TCP_SYN_SENT) {
		/* in the client's connect(): the local port may still be 0 here, so key by the socket */
		if (!is_svc_port(bpf_ntohs(sk->__sk_common.skc_dport)))
			return 0;
		__u32 tid;
		struct pc_task *c = current_task(&tid);
		if (!c || c->role != PC_ROLE_CLIENT)
			return 0;
		__u64 now = bpf_ktime_get_ns();
		client_start(c, now);
		struct pc_pending p = { .start_ts = now, .tid = tid, .sampled = c->sampled };
		if (bpf_map_update_elem(&pending, &key, &p, BPF_ANY))
			cstat(PC_STAT_PENDING_FULL);
		c->pend_key = key;
	} else if (newstate == TCP_ESTABLISHED && oldstate == TCP_SYN_RECV && hop_ports[0] &&
		   port_in(hop_ports, sk->__sk_common.skc_num) && in_path_netns(sk)) {
		/* a hop's end of a new connection: in its accept queue until the hop takes it (hop_first_read) */
		__u64 now = bpf_ktime_get_ns();
		bpf_map_update_elem(&hop_est, &key, &now, BPF_ANY);
	} else if (newstate == TCP_ESTABLISHED && oldstate == TCP_SYN_SENT) {
		struct pc_pending *p = bpf_map_lookup_elem(&pending, &key);
		if (p)
			syn_established(p, sk, bpf_ktime_get_ns());
	}
	return 0;
}

/* libc connect() in the client process (attached with its pid): a unix connect has no TCP states */
SEC("uprobe")
int BPF_KPROBE(pc_connect, int fd, const struct sockaddr *addr)
{
	__u16 fam = 0;
	__u32 tid;
	struct pc_task *c = current_task(&tid);
	if (!c || c->role != PC_ROLE_CLIENT || bpf_probe_read_user(&fam, sizeof(fam), addr) || fam != AF_UNIX)
		return 0;
	client_start(c, bpf_ktime_get_ns());
	c->unix_pending = 1;
	return 0;
}

/* ---------------- server side: accept and reap (uretprobes on libc in the postmaster) ---------------- */
SEC("uretprobe")
int BPF_KRETPROBE(pc_accept_ret, int ret)
{
	if ((__u32)(bpf_get_current_pid_tgid() >> 32) != pm_pid || ret < 0)
		return 0;
	if (pm_accept_ts)
		cstat(PC_STAT_ACCEPT_LOST);
	pm_accept_ts = bpf_ktime_get_ns();
	cstat(PC_STAT_ACCEPTS);
	return 0;
}

SEC("uretprobe")
int BPF_KRETPROBE(pc_reap, int ret)
{
	if ((__u32)(bpf_get_current_pid_tgid() >> 32) != pm_pid || ret <= 0)
		return 0;
	__u32 tid = ret;
	struct pc_task *t = bpf_map_lookup_elem(&who, &tid);
	if (!t || t->role != PC_ROLE_BACKEND)
		return 0;
	cstat(PC_STAT_REAPED);
	finish(t, tid, bpf_ktime_get_ns(), 1);
	return 0;
}

/* ---------------- messages: ready, delivery, first query, last receive ---------------- */
/* reached from the sk_data_ready tracepoint (>= 6.3) or fentry on sock_def_readable before it (msg.bpf.h) */
static __always_inline int on_data_ready(const struct sock *sk)
{
	__u32 tid;
	struct pc_task *t = current_tracked(&tid);
	/* a backend before ReadyForQuery, waking its client's socket: the message is queued there now */
	if (!t || t->role != PC_ROLE_BACKEND || t->ready_ts || t->dr_ts || !client_conn_sock(sk))
		return 0;
	/* TCP: this client's socket, not another connection's whose softirq happened to run on top of us */
	if (sk->__sk_common.skc_family != AF_UNIX &&
	    ((__u32)sk->__sk_common.skc_num << 16 | bpf_ntohs(sk->__sk_common.skc_dport)) != t->ports)
		return 0;
	t->dr_ts = bpf_ktime_get_ns();
	t->dr_sk = (__u64)sk;
	return 0;
}

SEC("tp_btf/sk_data_ready")
int BPF_PROG(pc_data_ready, const struct sock *sk)
{
	return on_data_ready(sk);
}

SEC("fentry/sock_def_readable")
int BPF_PROG(pc_data_ready__fentry, struct sock *sk)
{
	return on_data_ready(sk);
}

/* A backend whose client cannot be found (a hop or NAT between them): its own steps still describe the
 * connection -- fork, first run, start-up and authentication -- and the client's side is its connect.client_total */
static __always_inline void backend_alone(struct pc_task *t, __u64 at)
{
	step_charge(PC_ST_FORK, t->accept_ts, t->fork_ts);
	step_charge(PC_ST_FIRST_RUN, t->fork_ts, t->first_run_ts);
	step_charge(PC_ST_INIT_AUTH, t->first_run_ts, at);
	if (!t->fork_win)
		return;
	t->sampled = 1;
	cstat(PC_STAT_UNPAIRED_SAMPLED);
	step_ns(PC_ST_CPU_INIT, t->cpu[PC_B_INIT]);
}

static __always_inline void backend_ready(struct pc_task *t, struct sock *sk, __u64 now)
{
	__u64 at = t->dr_ts ? t->dr_ts : now, peer = t->dr_sk;
	if (!peer && sk->__sk_common.skc_family == AF_UNIX)
		peer = (__u64)BPF_CORE_READ((struct unix_sock *)sk, peer);
	if (!peer)
		peer = syn_peer_by_isn(sk);      /* delivered after the send (a delay line) or through NAT */
	t->ready_ts = at;
	rebucket(t, now, PC_B_IDLE);
	cstat(PC_STAT_READY);
	if (!peer) {
		cstat(PC_STAT_NO_PEER);
		backend_alone(t, at);
		return;
	}
	struct pc_pending *p = bpf_map_lookup_elem(&pending, &peer);
	if (!p) {
		cstat(PC_STAT_UNMATCHED);
		backend_alone(t, at);
		return;
	}
	t->matched = 1;
	cstat(PC_STAT_MATCHED);
	__u64 start = p->start_ts, est = p->est_ts, hs_from = p->hs_from;
	__u32 ctid = p->tid, p_sampled = p->sampled;
	__u64 acc_from = syn_accept_from(p, t->accept_ts, p_sampled);
	if (p->est_ts) {
		__u32 isn = p->srv_isn;
		bpf_map_delete_elem(&isn_pending, &isn);
	}
	bpf_map_delete_elem(&pending, &peer);
	step_charge(PC_ST_HANDSHAKE, est ? hs_from : 0, est);
	step_charge(PC_ST_ACCEPT, acc_from, t->accept_ts);
	step_charge(PC_ST_FORK, t->accept_ts, t->fork_ts);
	step_charge(PC_ST_FIRST_RUN, t->fork_ts, t->first_run_ts);
	step_charge(PC_ST_INIT_AUTH, t->first_run_ts, at);
	if (p_sampled) {                 /* started inside a window: its CPU and off-path steps are followed */
		t->sampled = 1;
		cstat(PC_STAT_SAMPLED);
		step_ns(PC_ST_CPU_INIT, t->cpu[PC_B_INIT]);
	}
	struct pc_task *c = bpf_map_lookup_elem(&who, &ctid);
	if (!c || c->start_ts != start)
		return;
	if (c->recv_ts > at)             /* the client already read it (woken before our send returned) */
		delivered(c, at, c->recv_ts);
	else
		c->ready_ts = at;
}

/* a send's end: sock_send_length (>= 6.3) or fexit of the protocol's sendmsg before it (msg.bpf.h) */
static __always_inline int on_send_end(struct sock *sk, int ret)
{
	__u32 tid;
	struct pc_task *t = current_tracked(&tid);
	if (!t || ret <= 0)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	if (t->role == PC_ROLE_CLIENT) {
		if (ret == 5 && client_conn_sock(sk)) {
			closed_change(t, now, 1);    /* 'X' + length: libpq's Terminate, PQfinish closing */
			t->closed_once = 1;
		}
		if (t->unix_pending && sk->__sk_common.skc_family == AF_UNIX) {   /* the startup packet */
			struct pc_pending p = { .start_ts = t->start_ts, .tid = tid, .sampled = t->sampled };
			__u64 key = (__u64)sk;
			t->unix_pending = 0;
			if (bpf_map_update_elem(&pending, &key, &p, BPF_ANY))
				cstat(PC_STAT_PENDING_FULL);
			t->pend_key = key;
		}
		return 0;
	}
	if (!own_conn_sock(sk))
		return 0;
	if (!t->ready_ts) {
		if (ret == 1) {              /* 'N' to an SSLRequest/GSSENCRequest: not the server's hello */
			cstat(PC_STAT_NEGOTIATION);
			t->dr_ts = t->dr_sk = 0;
			return 0;
		}
		backend_ready(t, sk, now);
	} else if (t->bucket == PC_B_QUERY) {
		rebucket(t, now, PC_B_SESSION);
		if (t->sampled) {
			step_span(PC_ST_FIRST_QUERY, t->qrecv_ts, now);
			step_ns(PC_ST_CPU_QUERY, t->cpu[PC_B_QUERY]);
		}
	}
	return 0;
}

SEC("tp_btf/sock_send_length")
int BPF_PROG(pc_send, struct sock *sk, int ret, int flags)
{
	return on_send_end(sk, ret);
}

SEC("fexit/inet_sendmsg")
int BPF_PROG(pc_send__fexit_inet, struct socket *sock, struct msghdr *msg, size_t size, int ret)
{
	return on_send_end(sock->sk, ret);
}

SEC("fexit/unix_stream_sendmsg")
int BPF_PROG(pc_send__fexit_unix, struct socket *sock, struct msghdr *msg, size_t size, int ret)
{
	return on_send_end(sock->sk, ret);
}

/* A hop's first read on a connection it accepted (any of its processes: pgpool's children are not followed):
 * ESTABLISHED -> here is the wait in its accept queue (pgpool with every child busy: for a free child), its
 * accept and its read of the client's first message, which was waiting already */
static __always_inline void hop_first_read(struct sock *sk, __u64 now)
{
	__u64 key = (__u64)sk, *est = bpf_map_lookup_elem(&hop_est, &key);
	if (!est)
		return;
	step_charge(PC_ST_HOP_ACCEPT, *est, now);
	bpf_map_delete_elem(&hop_est, &key);
}

/* a receive's end: sock_recv_length (>= 6.3) or fexit of the protocol's recvmsg before it (msg.bpf.h) */
static __always_inline int on_recv(struct sock *sk, int ret, int flags)
{
	if (hop_ports[0] && ret > 0 && sk->__sk_common.skc_family != AF_UNIX &&
	    port_in(hop_ports, sk->__sk_common.skc_num))
		hop_first_read(sk, bpf_ktime_get_ns());
	__u32 tid;
	struct pc_task *t = current_tracked(&tid);
	if (!t || ret < 0 || (flags & MSG_PEEK))
		return 0;
	__u64 now = bpf_ktime_get_ns();
	if (t->role == PC_ROLE_CLIENT) {
		if (ret == 0 || !client_conn_sock(sk))
			return 0;
		t->recv_ts = now;
		if (t->ready_ts) {
			rebucket(t, now, PC_B_IDLE);
			delivered(t, t->ready_ts, now);
		}
		if (ret > 1 && t->start_ts && !t->hello) {   /* the hello (the SSL refusal is 1 byte) */
			t->hello = 1;
			step_charge(PC_ST_CLIENT_TOTAL, t->start_ts, now);
			if (t->sampled)
				cstat(PC_STAT_CLIENTS_SAMPLED);
		}
		return 0;
	}
	if (!own_conn_sock(sk))
		return 0;
	if (!t->ports && sk->__sk_common.skc_family != AF_UNIX)
		t->ports = (__u32)bpf_ntohs(sk->__sk_common.skc_dport) << 16 | sk->__sk_common.skc_num;
	if (t->ready_ts && ret > 0 && !t->qrecv_ts) {
		t->qrecv_ts = now;
		rebucket(t, now, PC_B_QUERY);
	} else if (t->bucket == PC_B_SESSION || t->bucket == PC_B_TAIL) {
		/* only the CPU after the *last* receive is exit work: what came before it was session */
		rebucket(t, now, PC_B_TAIL);
		t->cpu[PC_B_SESSION] += t->cpu[PC_B_TAIL];
		t->cpu[PC_B_TAIL] = 0;
	}
	t->recv_ts = now;
	return 0;
}

SEC("tp_btf/sock_recv_length")
int BPF_PROG(pc_recv, struct sock *sk, int ret, int flags)
{
	return on_recv(sk, ret, flags);
}

SEC("fexit/inet_recvmsg")
int BPF_PROG(pc_recv__fexit_inet, struct socket *sock, struct msghdr *msg, size_t size, int flags, int ret)
{
	return on_recv(sock->sk, ret, flags);
}

SEC("fexit/unix_stream_recvmsg")
int BPF_PROG(pc_recv__fexit_unix, struct socket *sock, struct msghdr *msg, size_t size, int flags, int ret)
{
	return on_recv(sock->sk, ret, flags);
}
