// SPDX-License-Identifier: GPL-2.0
/* pathprof's tracing probes: per-message latency stages and per-role CPU accounting, aggregated in
 * the kernel and filtered to the run's own threads (the `tasks` map). Only tracepoints (tp_btf,
 * syscall tracepoints) and USDT: this kernel has no kprobes and refuses fentry. The stage model is
 * documented in pathprof.analysis.views; the shared map layout is in common.h.
 * Duty-cycled: all but fork/exit are attached only inside measurement windows (struct pp_win, common.h).
 * Cost matters more than completeness here (every event of every process passes through these
 * programs), so hot paths use per-CPU arrays and per-thread accumulators, never a hash update. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_endian.h>
#include <bpf/usdt.bpf.h>
#include "pathprof.h"

char LICENSE[] SEC("license") = "GPL";

#include "pathprof_helpers.h"
#include "pathprof_hops.h"

/* ---------------- start of a send: end of processing, start of the wire ----------------
 * TCP: the first tcp_sendmsg_locked of the send (a few hundred ns after the syscall entry; the syscall
 * tracepoints would give the entry itself, but enabling any of them puts every syscall of every process
 * on the slow path, which cost more than all of pathprof's programs together). AF_UNIX has no such
 * tracepoint: its send start is taken at the receiver's sk_data_ready (see pp_sk_data_ready). */
SEC("tp_btf/tcp_sendmsg_locked")
int BPF_PROG(pp_tcp_send, const struct sock *sk, const struct msghdr *msg, const struct sk_buff *skb, int goal)
{
	__u64 ws = win_start();
	if (!ws)
		return 0;
	__u32 tid;
	struct pp_task *t = cur_task(&tid, ws);
	if (t && !t->in_send) {
		t->send_ts = bpf_ktime_get_ns();
		t->in_send = 1;
	}
	return 0;
}

/* ---------------- scheduler: on-CPU accounting and wakeups ---------------- */
SEC("tp_btf/sched_switch")
int BPF_PROG(pp_sched_switch, bool preempt, struct task_struct *prev, struct task_struct *next,
	     unsigned int prev_state)
{
	__u64 ws = win_start();
	if (!ws)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	struct pp_cpu_state *cs = cpu_state(ws);
	if (!cs)
		return 0;
	__u32 ptid = prev->pid, ntid = next->pid;
	struct pp_task *pt = cs->cur_tracked ? task_of(ptid, ws) : 0;
	if (pt) {
		/* switched in before the window opened (oncpu_ts reset): on CPU since the window start */
		__u64 on = pt->oncpu_ts ? pt->oncpu_ts : ws, snap = pt->oncpu_ts ? pt->excl_snap : cs->excl_win0;
		__u64 d = now - on, ex = cs->excl_total - snap;
		pt->acc.oncpu_ns += d > ex ? d - ex : 0;
		__u64 ut = prev->utime, st = prev->stime;
		if (pt->last_utime || pt->last_stime) {
			pt->acc.utime_ns += ut - pt->last_utime;
			pt->acc.stime_ns += st - pt->last_stime;
		}
		pt->last_utime = ut;
		pt->last_stime = st;
		pt->acc.switches += 1;
		pt->oncpu_ts = 0;
		if (preempt || prev_state == 0)
			pt->runnable_ts = now;       /* still runnable: waits on the run queue */
	} else if (ptid && cs->last_switch) {
		__u64 d = now - cs->last_switch, ex = cs->excl_total - cs->excl_at_switch;
		cs->other_ns += d > ex ? d - ex : 0;
	}
	cs->last_switch = now;
	cs->excl_at_switch = cs->excl_total;
	struct pp_task *nt = task_of(ntid, ws);
	cs->cur_tracked = nt != 0;
	if (nt) {
		nt->oncpu_ts = now;
		nt->excl_snap = cs->excl_total;
		if (nt->runnable_ts) {
			nt->acc.runq_ns += now - nt->runnable_ts;
			nt->acc.runq_cnt += 1;
			nt->runnable_ts = 0;
		}
	}
	return 0;
}

static __always_inline void on_wakeup(struct task_struct *p)
{
	__u64 ws = win_start();
	if (!ws)
		return;
	struct pp_task *t = task_of(p->pid, ws);
	if (t) {
		__u64 now = bpf_ktime_get_ns();
		t->wake_ts = now;
		t->runnable_ts = now;
	}
}

SEC("tp_btf/sched_wakeup")
int BPF_PROG(pp_sched_wakeup, struct task_struct *p) { on_wakeup(p); return 0; }

SEC("tp_btf/sched_wakeup_new")
int BPF_PROG(pp_sched_wakeup_new, struct task_struct *p) { on_wakeup(p); return 0; }

/* Always attached (rare, and it keeps the tracked set right between windows): a child of a tracked
 * thread inherits its role; a new process forked by the postmaster is a backend. */
SEC("tp_btf/sched_process_fork")
int BPF_PROG(pp_fork, struct task_struct *parent, struct task_struct *child)
{
	__u32 ptid = parent->pid, ctid = child->pid;
	struct pp_task *pt = bpf_map_lookup_elem(&tasks, &ptid);
	if (!pt)
		return 0;
	struct pp_task n = { .role = pt->role, .hop = pt->hop };
	if (pt->role == PP_ROLE_POSTMASTER && child->tgid != parent->tgid)
		n.role = PP_ROLE_BACKEND;
	if (bpf_map_update_elem(&tasks, &ctid, &n, BPF_ANY))
		stat_inc(PP_STAT_TASKS_FULL);
	return 0;
}

/* Always attached: fold the exiting thread's accumulators (filled only inside windows) into its role's
 * totals, so the sums stay monotonic */
SEC("tp_btf/sched_process_exit")
int BPF_PROG(pp_exit, struct task_struct *p)
{
	__u32 tid = p->pid;
	struct pp_task *t = bpf_map_lookup_elem(&tasks, &tid);
	if (!t)
		return 0;
	struct pp_cpu_key k = { .comp = PP_CPU_ONCPU, .role = t->role, .hop = t->hop };
	struct pp_cpu_val *v = bpf_map_lookup_elem(&cpu, &k);
	if (!v) {
		struct pp_cpu_val z = {};
		bpf_map_update_elem(&cpu, &k, &z, BPF_NOEXIST);
		v = bpf_map_lookup_elem(&cpu, &k);
	}
	if (v) {
		__sync_fetch_and_add(&v->oncpu_ns, t->acc.oncpu_ns);
		__sync_fetch_and_add(&v->utime_ns, t->acc.utime_ns);
		__sync_fetch_and_add(&v->stime_ns, t->acc.stime_ns);
		__sync_fetch_and_add(&v->runq_ns, t->acc.runq_ns);
		__sync_fetch_and_add(&v->runq_cnt, t->acc.runq_cnt);
		__sync_fetch_and_add(&v->switches, t->acc.switches);
	} else {
		stat_inc(PP_STAT_CPU_FULL);
	}
	bpf_map_delete_elem(&tasks, &tid);
	return 0;
}

/* ---------------- NET softirqs: carved out of the task they interrupted ---------------- */
SEC("tp_btf/softirq_entry")
int BPF_PROG(pp_softirq_entry, unsigned int vec)
{
	if (vec != NET_RX_SOFTIRQ && vec != NET_TX_SOFTIRQ)
		return 0;
	__u64 ws = win_start();
	if (!ws)
		return 0;
	struct pp_cpu_state *cs = cpu_state(ws);
	if (cs) {
		cs->softirq_start = bpf_ktime_get_ns();
		cs->nf_in_softirq = 0;
	}
	return 0;
}

SEC("tp_btf/softirq_exit")
int BPF_PROG(pp_softirq_exit, unsigned int vec)
{
	if (vec != NET_RX_SOFTIRQ && vec != NET_TX_SOFTIRQ)
		return 0;
	__u64 ws = win_start();
	if (!ws)
		return 0;
	struct pp_cpu_state *cs = cpu_state(ws);
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

/* ---------------- messages: ready -> consumed -> next send ---------------- */
SEC("tp_btf/sk_data_ready")
int BPF_PROG(pp_sk_data_ready, const struct sock *sk)
{
	__u64 ws = win_start();
	if (!ws)
		return 0;
	__u64 key = (__u64)sk;
	struct pp_sock *s = bpf_map_lookup_elem(&socks, &key);
	__u32 tid;
	if (!s) {
		if (cur_task(&tid, ws))
			stat_inc(PP_STAT_READY_UNLEARNED);
		return 0;
	}
	if (s->ready_ts >= ws)
		return 0;                     /* queue not drained: the same message continues */
	if (s->ready_ts)
		stat_inc(PP_STAT_WINDOW_EDGE);   /* left pending by an earlier window */
	__u64 now = bpf_ktime_get_ns();
	s->ready_ts = now;
	s->seq += 1;
	stat_inc(PP_STAT_MESSAGES);
	/* loopback/veth/unix: delivery runs inside the sender's send, so current = sender, and in_send
	 * tells it apart from a receiver draining its socket backlog inside recv */
	struct pp_task *t = cur_task(&tid, ws);
	if (t && t->in_send && now > t->send_ts) {
		span(PP_ST_WIRE, s->role, s->leg, s->hop, t->send_ts, now - t->send_ts, s->seq);
		if (t->role == PP_ROLE_QEMU)
			t->in_send = 0;           /* a tap write has no sock_send_length (pp_tap_recv) */
	} else if (t && !t->in_send && sk->__sk_common.skc_family == 1 /* AF_UNIX */) {
		t->send_ts = now;             /* unix: the send path up to here stays in the sender's stage */
		t->in_send = 1;
		stat_inc(PP_STAT_WIRE_UNTIMED);
	} else {
		stat_inc(PP_STAT_WIRE_UNPAIRED);
	}
	return 0;
}

SEC("tp_btf/sock_recv_length")
int BPF_PROG(pp_sock_recv, struct sock *sk, int ret, int flags)
{
	if (ret <= 0 || (flags & MSG_PEEK))
		return 0;
	__u64 ws = win_start();
	if (!ws)
		return 0;
	__u32 tid;
	struct pp_task *t = cur_task(&tid, ws);
	if (!t || (is_hop_role(t->role) && sk->sk_protocol == IPPROTO_TCP_NUM))
		return 0;                     /* a hop's TCP consumes: pp_tcp_consume (pathprof_hops.h) */
	on_consume(sk, t, ws, 0);
	return 0;
}

SEC("tp_btf/sock_send_length")
int BPF_PROG(pp_sock_send, struct sock *sk, int ret, int flags)
{
	__u64 ws = win_start();
	if (!ws)
		return 0;
	__u32 tid;
	struct pp_task *t = cur_task(&tid, ws);
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
	if (is_hop_role(t->role)) {       /* forwards this thread's last unforwarded consume (pathprof_hops.h) */
		if (t->consume_ts) {
			start = t->consume_ts;
			leg = t->consume_leg;
			seq = t->consume_seq;
			t->consume_ts = 0;
		}
	} else if (s && s->consume_ts && s->consume_ts < ws) {
		stat_inc(PP_STAT_WINDOW_EDGE);  /* consumed before the window opened */
		s->consume_ts = 0;
	} else if (s && s->consume_ts) {  /* request/response on the same connection (backend, pgbench) */
		start = s->consume_ts;
		seq = s->seq;
		leg = t->role == PP_ROLE_PGBENCH ? PP_LEG_CLIENT : PP_LEG_SERVER;
		s->consume_ts = 0;
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
	if (skb->protocol != bpf_htons(0x0800))
		return 0;
	__u64 ws = win_start();
	if (!ws)
		return 0;
	__u32 netns = dev->nd_net.net->ns.inum;
	if (netns_slot_of(netns) == PP_MAX_NETNS - 1)
		return 0;                     /* not a device of this topology (other runs use the same ports) */
	struct pp_tuple tu = {};
	if (!ip_tuple(skb->head + skb->network_header, &tu) || !tu.payload)
		return 0;
	__u8 leg = tuple_leg(&tu);
	if (!leg)
		return 0;
	struct pp_devq q = { .leg = leg, .ifindex = dev->ifindex, .netns = netns };
	__u64 key = (__u64)skb;
	__u32 tid;
	struct pp_task *t = cur_task(&tid, ws);
	if (t && t->in_send)
		q.send_ts = t->send_ts;       /* a tap: wire.qemu starts there (pathprof_hops.h) */
	q.ts = bpf_ktime_get_ns();
	if (bpf_map_update_elem(&devq, &key, &q, BPF_ANY))
		stat_inc(PP_STAT_DEV_FULL);
	return 0;
}

SEC("tp_btf/netif_receive_skb")
int BPF_PROG(pp_dev_recv, struct sk_buff *skb)
{
	__u64 ws = win_start();
	if (!ws)
		return 0;
	__u64 key = (__u64)skb;
	struct pp_devq *q = bpf_map_lookup_elem(&devq, &key);
	if (!q)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	if (q->ts >= ws) {
		struct pp_stage_key k = { .stage = PP_ST_DEV, .leg = q->leg, .hop = q->ifindex, .netns = q->netns };
		stage_add(&k, now - q->ts);
	} else {
		stat_inc(PP_STAT_WINDOW_EDGE);
	}
	bpf_map_delete_elem(&devq, &key);
	return 0;
}

/* ---------------- PostgreSQL USDT (--probes deep) ---------------- */
static __always_inline int usdt_mark(int i, int done, __u8 stage)
{
	__u64 ws = win_start();
	if (!ws)
		return 0;
	__u32 tid;
	struct pp_task *t = cur_task(&tid, ws);
	if (!t || i < 0 || i >= PP_NUSDT)
		return 0;
	__u64 now = bpf_ktime_get_ns();
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
