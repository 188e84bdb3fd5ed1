/* Scheduler: on-CPU accounting per role, wakeups, forks; NET softirqs carved out of the task they interrupt.
 * Part of pathprof.bpf.c (one object: every family shares its maps); included in order, not alone. */
#ifndef PATHPROF_SCHED_BPF_H
#define PATHPROF_SCHED_BPF_H

/* ---------------- scheduler: on-CPU accounting and wakeups ---------------- */
/* Is p's group held by CFS bandwidth control (a cgroup's CPU quota used up for this period)? throttle_count
 * counts the throttled levels of its cfs_rq's hierarchy. Kernels without CONFIG_CFS_BANDWIDTH have no field:
 * never throttled. */
static __always_inline int cfs_throttled(struct task_struct *p)
{
	if (!bpf_core_field_exists(struct cfs_rq, throttle_count) || !bpf_core_field_exists(p->se.cfs_rq))
		return 0;
	struct cfs_rq *q = p->se.cfs_rq;
	return q && q->throttle_count > 0;
}

/* Since 6.18 a throttled group's threads run on until they return to user space (task-based throttling: then
 * they are switched out, still runnable); before, a thread woken into a throttled group waited on the run queue. */
static __always_inline int throttle_at_wakeup(void)
{
	return !bpf_core_field_exists(struct task_struct, throttled);
}

/* A thread can begin a run-queue wait in an unthrottled group and still wait for its quota: a sibling in the group
 * (the postmaster, an auxiliary process) uses the quota up meanwhile, and kernels before 6.18 dequeue the group's
 * cfs_rq, the waiting thread with it (a capped server in a one-CPU guest: 2 of 10 waits, ~100 ms each, were counted
 * as the backend's queue; CI 2026-11-28). At the wait's start: the cfs_rq and, since 6.7, its throttled time so far */
static __always_inline void throttle_mark(struct task_struct *p, struct pp_task *t)
{
	if (!bpf_core_field_exists(p->se.cfs_rq))
		return;
	struct cfs_rq *q = p->se.cfs_rq;
	t->thr_rq = (__u64)q;
	if (q && bpf_core_field_exists(q->throttled_clock_self_time))
		t->thr_base = q->throttled_clock_self_time;
}

/* At the switch-in ending that wait: where the throttle within it began (0: none). Since 6.7 the cfs_rq sums its
 * throttled time at each unthrottle (and clears throttled_clock): the wait's last that much was throttled; before,
 * throttled_clock keeps its last throttle's start, on the run queue's clock (rq->clock, updated by this switch) */
static __always_inline __u64 throttled_since(struct task_struct *p, struct pp_task *t, __u64 from, __u64 now)
{
	if (!bpf_core_field_exists(p->se.cfs_rq))
		return 0;
	struct cfs_rq *q = p->se.cfs_rq;
	if (!q || (__u64)q != t->thr_rq)
		return 0;                     /* moved to another CPU meanwhile: its cfs_rq's history is another's */
	if (bpf_core_field_exists(q->throttled_clock_self_time)) {
		__u64 d = q->throttled_clock_self_time - t->thr_base;
		if (!d)
			return 0;
		return d < now - from ? now - d : from;
	}
	if (!bpf_core_field_exists(q->throttled_clock) || !bpf_core_field_exists(q->rq))
		return 0;
	struct rq *rq = q->rq;
	__u64 t0 = q->throttled_clock, rc = rq ? rq->clock : 0;
	if (!t0 || t0 > rc || rc - t0 >= now - from)
		return 0;                     /* never, or before the wait began */
	return now - (rc - t0);
}

SEC("tp_btf/sched_switch")
int BPF_PROG(pp_sched_switch, PP_SWITCH_ARGS)
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
		if (preempt || PP_PREV_STATE == 0) {
			pt->runnable_ts = now;       /* still runnable: waits on the run queue */
			if (cfs_throttled(prev))
				pt->thr_from = now;  /* ... or for its cgroup's next CPU quota */
			else if (throttle_at_wakeup())
				throttle_mark(prev, pt);   /* ... which a sibling may use up while it waits */
		} else {
			pt->thro_ns = 0;             /* asleep: a span it ends later began after this */
		}
	} else if (cs->last_switch) {
		__u64 d = now - cs->last_switch, ex = cs->excl_total - cs->excl_at_switch;
		d = d > ex ? d - ex : 0;
		if (prev->pid) {
			cs->other_ns += d;
		} else {             /* pid 0: the idle task; user space subtracts the no-HZ idle time from it */
			cs->idle_ns += d;
			cs->idle_cnt += 1;
		}
	}
	cs->last_switch = now;
	cs->excl_at_switch = cs->excl_total;
	__u32 cpu = bpf_get_smp_processor_id();
	__u64 *idle = bpf_map_lookup_elem(&cpu_idle, &cpu);
	if (idle)
		*idle = next->pid == 0 ? now : 0;    /* pid 0: this CPU's idle task */
	struct pp_task *nt = next->pid ? task_of(next, ws) : 0;   /* idle is never tracked: no lookup */
	cs->cur_tracked = nt != 0;
	if (nt) {
		nt->oncpu_ts = now;
		nt->excl_snap = cs->excl_total;
		/* a waker on another CPU may write it; pathprof-510.bpf.o (no xchg): a wakeup stamped between the load
		 * and the store is lost, and with it that run-queue wait */
		__u64 r = pp_xchg(&nt->runnable_ts, 0);
		struct pp_cpu_val *a = r ? cpu_acc(nt) : 0;
		if (a && now > r) {
			a->runq_ns += now - r;
			a->runq_cnt += 1;
		}
		if (r && !nt->thr_from && now > r && throttle_at_wakeup()) {
			nt->thr_from = throttled_since(next, nt, r, now);
			if (nt->thr_from)
				stat_inc(PP_STAT_THROTTLED_WAITING);
		}
		if (nt->thr_from) {
			if (now > nt->thr_from) {
				if (nt->thr1_e > nt->thr1_s) {      /* the oldest of the two joins the sum */
					if (!nt->thro_ns)
						nt->thro_s = nt->thr1_s;
					nt->thro_e = nt->thr1_e;
					nt->thro_ns += nt->thr1_e - nt->thr1_s;
				}
				nt->thr1_s = nt->thr0_s;
				nt->thr1_e = nt->thr0_e;
				nt->thr0_s = nt->thr_from;
				nt->thr0_e = now;
				a = a ? a : cpu_acc(nt);
				if (a) {
					a->thr_ns += now - nt->thr_from;
					a->thr_cnt += 1;
				}
			}
			nt->thr_from = 0;
		}
		cs->thr0_s = nt->thr0_s;
		cs->thr0_e = nt->thr0_e;
		cs->thr1_s = nt->thr1_s;
		cs->thr1_e = nt->thr1_e;
		cs->thro_s = nt->thro_s;
		cs->thro_e = nt->thro_e;
		cs->thro_ns = nt->thro_ns;
		cs->thr_role = nt->role;
		cs->thr_hop = nt->hop;
	} else {
		cs->thr0_e = cs->thr1_e = cs->thro_ns = 0;
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
		if (throttle_at_wakeup() && cfs_throttled(p))
			t->thr_from = now;          /* woken into a group whose CPU quota is used up */
		else if (throttle_at_wakeup())
			throttle_mark(p, t);        /* ... or used up by a sibling while it waits */
		/* woken onto an idle CPU? (a queued wakeup runs on that CPU once it left idle: still idle here) */
		__u32 cpu = pp_task_cpu(p);   /* a plain load: p is a BTF pointer */
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
 * its CPU time is already in `cpuacc`, and its storage goes away with it (pathprof-510.bpf.o: pp_exit). */
SEC("tp_btf/sched_process_fork")
int BPF_PROG(pp_fork, struct task_struct *parent, struct task_struct *child)
{
	struct pp_task *pt = task_get(&tasks, parent);
	if (!pt)
		return 0;
	struct pp_task n = { .role = pt->role, .hop = pt->hop };
	if (pt->role == PP_ROLE_POSTMASTER && child->tgid != parent->tgid) {
		n.role = PP_ROLE_BACKEND;
		n.conn_setup = conn_split;    /* a new connection: its first exchange is the setup */
	}
	if (!task_create(&tasks, child, &n))
		stat_inc(PP_STAT_TASKS_FULL);
	return 0;
}

#ifdef PP_NO_LOCAL_STORAGE
/* pathprof-510.bpf.o: the thread's entries in the hash maps that stand in for task storage (pp_state.bpf.h) go
 * with it, before its id can be reused. Attached for the whole session, as pp_fork is (one run per exiting thread
 * of the machine, two hash deletes). */
SEC("tp_btf/sched_process_exit")
int BPF_PROG(pp_exit, struct task_struct *p)
{
	__u32 tid = p->pid;
	bpf_map_delete_elem(&tasks, &tid);
	bpf_map_delete_elem(&holdq, &tid);
	return 0;
}
#endif

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

/* Threads user space could not give storage itself: a pidfd for a thread other than a process's main one needs
 * PIDFD_THREAD (Linux >= 6.9). User space puts them in `adopt` (tid -> role and hop) and runs this iterator once
 * over every task; loaded only on such kernels (pathprof.agent.probing.session), so it costs nothing elsewhere. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct pp_task);
} adopt SEC(".maps");

SEC("iter/task")
int pp_adopt(struct bpf_iter__task *ctx)
{
	struct task_struct *task = ctx->task;
	if (!task)
		return 0;
	__u32 tid = task->pid;
	struct pp_task *want = bpf_map_lookup_elem(&adopt, &tid);
	if (!want)
		return 0;
	struct pp_task *t = task_create(&tasks, task, 0);
	if (t) {             /* as user space does through a pidfd: what it has in flight is kept, role and hop set */
		t->role = want->role;
		t->hop = want->hop;
	} else {
		stat_inc(PP_STAT_TASKS_FULL);
	}
	bpf_map_delete_elem(&adopt, &tid);
	return 0;
}

#endif /* PATHPROF_SCHED_BPF_H */
