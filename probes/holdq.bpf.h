/* Requests a hop holds before forwarding them (a pooler out of server connections): the `holdq` of each hop
 * thread and the `holdts` stamps, see struct pp_holdq in pathprof.h. The wait becomes the stage
 * poolwait.<hop> on the request leg; the hop's own work forwarding it stays hop.<hop>.
 *
 * The wait is charged by identity, when the hop answers the client: from the client socket's stamp (its request
 * read) to where the hop began forwarding that request upstream, which the server connection carried back with
 * the response (pp_sock.fwd_act -> pp_task.fwd_act). The queue only decides where a forward's own work begins and
 * which trace number it carries: it cannot know the requests a pooler already held when the window opened (read
 * before the probes were attached), so after a window start its pops may take younger requests than the one
 * forwarded; a wait charged at the pop was short by as many round trips as requests held then, for as long as
 * every forward found the queue non-empty (a pool of one in lock-step: -13 %, at 1 ms per round trip -79 %).
 * Part of pathprof.bpf.c (one object: every family shares its maps); included in order, not alone. */
#ifndef PATHPROF_HOLDQ_BPF_H
#define PATHPROF_HOLDQ_BPF_H

#define PP_HOLD_SKIPS 8     /* stale entries dropped per forward at most (the rest on later forwards) */

static __always_inline __u32 hold_id_of(struct pp_sock *s)
{
	if (!s->hold_id) {
		__u32 zero = 0, *next = bpf_map_lookup_elem(&hold_ids, &zero);
		if (!next)
			return 0;
		/* pathprof-510.bpf.o (no fetch-add): two sockets numbered at once on two CPUs may share an id, and so
		 * a slot of `holdts`, as two ids PP_HOLD_SLOTS apart do (a held request then looks superseded) */
		__u32 id = pp_fetch_add(next, 1) + 1;
		s->hold_id = id ? id : 1;
	}
	return s->hold_id;
}

/* a hop consumed a client's request on s at `now` (len bytes): queue it until a forward upstream takes it */
static __always_inline void hold_push(struct task_struct *task, struct pp_sock *s, __u64 now, __u32 seq, __u32 len)
{
	struct pp_holdq *q = task_create(&holdq, task, 0);
	__u32 id = hold_id_of(s), slot = id & (PP_HOLD_SLOTS - 1);
	__u64 *valid = bpf_map_lookup_elem(&holdts, &slot);
	if (!q || !id || !valid)
		return;
	q->last_act = now;
	if (q->tail - q->head >= PP_HOLDQ) {
		q->head++;                    /* full: the oldest is lost (its request's wait with it) */
		stat_inc(PP_STAT_HOLD_FULL);
	}
	if (*valid && q->tail != q->head) {   /* the rest of a request read in parts: its length so far */
		struct pp_hold *last = &q->e[(q->tail - 1) & (PP_HOLDQ - 1)];
		if (last->id == id && last->ts == *valid)
			len += last->len;
	}
	struct pp_hold *e = &q->e[q->tail & (PP_HOLDQ - 1)];
	e->ts = now;
	e->seq = seq;
	e->id = id;
	e->len = len;
	q->tail++;
	*valid = now;                     /* a later request on the same socket supersedes this one */
	s->hold_seq = seq;
}

/* The hop sends to the client on s: an answer (a response it forwards, or one of its own: an admin console, an
 * error). A request of it still held is not waiting any more; when the thread is forwarding a response, the
 * request's wait ends where the hop began forwarding it upstream (t->fwd_act): poolwait.<hop>. */
static __always_inline void hold_answered(struct pp_sock *s, struct pp_task *t, __u64 ws)
{
	__u64 act = t->fwd_act;
	t->fwd_act = 0;
	if (!s->hold_id)
		return;
	__u32 slot = s->hold_id & (PP_HOLD_SLOTS - 1);
	__u64 *valid = bpf_map_lookup_elem(&holdts, &slot);
	if (!valid)
		return;
	__u64 r = *valid;
	*valid = 0;
	if (!r || act <= r)
		return;                       /* nothing held, or answered by the hop itself */
	if (r < ws) {
		stat_inc(PP_STAT_WINDOW_EDGE);
		return;
	}
	struct pp_stage_key k = { .stage = PP_ST_POOLWAIT, .role = t->role, .leg = PP_LEG_REQUEST, .hop = t->hop };
	stage_add(&k, act - r);
	trace_emit(PP_ST_POOLWAIT, t->role, PP_LEG_REQUEST, t->hop, r, act - r, s->hold_seq);
}

/* the hop forwarded a request upstream on u, its forwarding begun at `act`: the connection carries it until the
 * response is taken (the first forward since then: a pooler making several round trips for one request) */
static __always_inline void hold_forwarded(struct pp_sock *u, __u64 act)
{
	if (!u->fwd_act)
		u->fwd_act = act;
}

/* the hop took a response on u: the request it answers began its forwarding at u->fwd_act. The earliest one not
 * yet answered is kept: a pooler's further round trips for the same request come before the client's answer, each
 * forwarded after the one before was taken. A kept stamp later than this response's forward is not such a round
 * trip but another client's, answered from another thread: a hop whose threads hand work over (Go's docker-proxy
 * moves a goroutine to another thread while it waits) left it behind, and the next answer from this thread was
 * charged poolwait.<hop> up to it (docker-dnat, 1 % loss: 73-250 us/txn of waits inside the request's TCP
 * recovery, counted twice). The earliest is literally kept: a stale stamp never lengthens a wait. */
static __always_inline void hold_response(struct pp_sock *u, struct pp_task *t)
{
	if (u->fwd_act && (!t->fwd_act || u->fwd_act < t->fwd_act))
		t->fwd_act = u->fwd_act;
	u->fwd_act = 0;
}

/* a forward upstream: the oldest valid held request, 0 when none. *act is where the hop's forwarding work
 * began (its last other activity, never before the request arrived); stale entries are dropped, counted. The
 * stamp stays: the answer to the client charges the wait (hold_answered). */
static __always_inline struct pp_hold *hold_pop(struct task_struct *task, __u64 ws, __u64 *act)
{
	struct pp_holdq *q = task_get(&holdq, task);
	if (!q)
		return 0;
	for (int i = 0; i < PP_HOLD_SKIPS; i++) {
		if (q->tail == q->head)
			return 0;
		struct pp_hold *e = &q->e[q->head & (PP_HOLDQ - 1)];
		q->head++;
		__u32 slot = e->id & (PP_HOLD_SLOTS - 1);
		__u64 *valid = bpf_map_lookup_elem(&holdts, &slot);
		if (!valid || *valid != e->ts || e->ts < ws) {
			stat_inc(e->ts < ws ? PP_STAT_WINDOW_EDGE : PP_STAT_HOLD_STALE);
			continue;
		}
		*act = q->last_act > e->ts ? q->last_act : e->ts;
		return e;
	}
	return 0;
}

/* the request the next forward upstream will take (the oldest valid one, read inside the window ws: 0 = any),
 * 0 when none: a stale entry (superseded, answered by the hop itself, read before the window) holds nothing */
static __always_inline struct pp_hold *hold_peek(struct task_struct *task, __u64 ws)
{
	struct pp_holdq *q = task_get(&holdq, task);
	if (!q)
		return 0;
	for (int i = 0; i < PP_HOLD_SKIPS; i++) {
		__u32 at = q->head + i;
		if (at == q->tail)
			return 0;
		struct pp_hold *e = &q->e[at & (PP_HOLDQ - 1)];
		__u32 slot = e->id & (PP_HOLD_SLOTS - 1);
		__u64 *valid = bpf_map_lookup_elem(&holdts, &slot);
		if (valid && *valid == e->ts && e->ts >= ws)
			return e;
	}
	return 0;
}

/* --trace-sample: the number of the request the next forward upstream will take */
static __always_inline __u32 hold_peek_seq(struct task_struct *task)
{
	struct pp_hold *e = hold_peek(task, 0);
	return e ? e->seq : 0;
}

/* the hop's activity that is not a held request: where the next held request's forwarding may begin */
static __always_inline void hold_activity(struct task_struct *task, __u64 ts)
{
	struct pp_holdq *q = task_get(&holdq, task);
	if (q && ts > q->last_act)
		q->last_act = ts;
}

#endif /* PATHPROF_HOLDQ_BPF_H */
