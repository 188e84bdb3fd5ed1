/* A reply a hop (a pooler, docker-proxy) relays in parts: it reads a part on its server connection, forwards it to
 * the client, reads the next. The parts' own chains (wire into the hop, the hop's wait, hop.<name>) overlap one
 * another and the client's pieces: the hop reads the next part while the previous one crosses to the client, and
 * while the client's window is full. So a reply's first part is measured where it happens, as any message, and a
 * later part's chain is kept on the hop's thread (pp_task ch_*) and accounted once, by the reply's last receiver,
 * for the time since its previous piece (stall.bpf.h piece_more): send_blocked.<hop> when that piece left its
 * window full, else the chain of the part whose forward delivers this piece, each link clipped at the previous
 * piece -- the upstream sender's work up to its send, wire into the hop, the hop's wait (woken, run queue,
 * receive, or queued), the hop's processing up to its send, wire to the receiver. A part that reaches the client
 * as a first piece (a hop that gathers parts before it forwards) has its chain emitted unclipped, as before.
 * The reply is the server connection's from the hop's first read of it to the hop's next send on it: pgpool
 * forwards a reply in parts between its own round trips upstream, and each of those parts starts a reply anew
 * (counting them from the client's previous piece overlapped its round trips: pgpool -C +5.4 %).
 * Request legs are not relayed this way (a hop's requests go through holdq.bpf.h).
 * Part of pathprof.bpf.c (one object: every family shares its maps); included in order, not alone. */
#ifndef PATHPROF_RELAY_BPF_H
#define PATHPROF_RELAY_BPF_H

#define PP_RELAY_DEFERRED 1   /* pp_task.consume_later: a later part's chain waits for the receiver to take it */
#define PP_RELAY_EMITTED  2   /* ... emitted unclipped at a first piece: the hop's processing is its own again */

/* sk_data_ready on a hop's server connection, a new part (the queue was drained): is it a later part of a reply
 * the hop has begun to read? Then no wire here: keep the upstream send that delivers it (0: delivered outside
 * that send), for the receiver's chain */
static __always_inline int relay_ready(struct sock *sk, struct pp_sock *s, struct pp_task *t, __u64 ws)
{
	if (!is_hop_role(s->role) || s->leg != PP_LEG_RESPONSE || s->reply_ts < ws)
		return 0;
	int in = t && sending(t, (__u64)sk) && !is_hop_role(t->role);
	s->up_send = in ? t->send_ts : 0;
	if (in) {
		s->peer_role = t->role;
		s->peer_hop = t->hop;
		s->up_from = t->answer_ts;   /* the same for all of one answer's sends */
	}
	return 1;
}

/* a hop's consume on its server connection (r: the part's arrival, 0 when it read on from what was queued): the
 * first part of a reply is measured here (return 0); a later one's
 * chain is kept on the thread until its forward reaches the receiver */
static __always_inline int relay_consume(struct pp_sock *s, struct pp_task *t, __u64 r, __u64 w, __u64 on,
					 __u64 now, __u64 ws)
{
	if (s->leg != PP_LEG_RESPONSE)
		return 0;
	if (s->reply_ts < ws) {
		s->reply_ts = now;
		return 0;
	}
	/* r = 0: read on from what was already queued, no arrival since the last read: the hop's own processing */
	t->ch_up_send = !r || s->up_send > r ? 0 : s->up_send;
	t->ch_up_role = s->peer_role;
	t->ch_up_hop = s->peer_hop;
	t->ch_up_from = s->up_from;
	t->ch_ready = r;
	t->ch_wake = w;
	t->ch_oncpu = on;
	t->ch_idle = t->wake_idle;
	t->ch_consume = r ? now : 0;
	stat_inc(PP_STAT_RELAYED);
	return 1;
}

/* one link of a chain: [at, to] as `stage`, if it lies after at; where the next link starts */
static __always_inline __u64 relay_link(__u8 stage, __u8 role, __u8 leg, __u32 hop, __u64 at, __u64 to, __u32 seq)
{
	if (to <= at)
		return at;
	span(stage, role, leg, hop, at, to - at, seq);
	return to;
}

/* the hop t's kept chain from `at` up to its consume: the upstream sender's work, wire into the hop, its wait.
 * A global function, verified once on its own: inlined, its branches multiplied sk_data_ready's paths past the
 * verifier's limit. Before Linux 5.12 a global function takes no pointer argument: pathprof-510.bpf.o's looks t up
 * itself, as the current thread's (the hop whose send delivers the piece: every caller's t is cur_task's) */
#ifndef PP_NO_LOCAL_STORAGE
__noinline __u64 relay_links(struct pp_task *t, __u8 leg, __u64 at, __u32 seq)
{
#else
#define relay_links(t, leg, at, seq) relay_links_cur(leg, at, seq)
__noinline __u64 relay_links_cur(__u8 leg, __u64 at, __u32 seq)
{
	struct pp_task *t = cur_task_get(&tasks);
#endif
	if (!t)
		return at;
	__u8 ur = t->ch_up_role;
	if (ur && t->ch_up_send)
		at = relay_link(PP_ST_PROC, ur, ur == PP_ROLE_BACKEND ? PP_LEG_SERVER : leg, t->ch_up_hop, at,
				t->ch_up_send, seq);
	at = relay_link(PP_ST_WIRE, t->role, leg, t->hop, at, t->ch_ready, seq);
	if (t->ch_wake) {
		at = relay_link(t->ch_idle ? PP_ST_IDLE_EXIT : PP_ST_WAKEUP, t->role, leg, t->hop, at, t->ch_wake, seq);
		at = relay_link(PP_ST_RUNQUEUE, t->role, leg, t->hop, at, t->ch_oncpu, seq);
		return relay_link(PP_ST_RECV, t->role, leg, t->hop, at, t->ch_consume, seq);
	}
	return relay_link(PP_ST_QUEUED, t->role, leg, t->hop, at, t->ch_consume, seq);
}

/* a later piece into s, delivered inside the hop t's forward of a later part: [prev, now] along its chain. Not
 * before the upstream sender's answer began: up to there its own stages hold the time (the hop forwarded earlier
 * parts before that answer, pgpool the replies of its round trips upstream: the backend's execute is its own) */
static __always_inline void relay_piece(struct pp_sock *s, struct pp_task *t, __u64 prev, __u64 now, __u32 seq)
{
	__u64 at = relay_links(t, s->leg, prev > t->ch_up_from ? prev : t->ch_up_from, seq);
	at = relay_link(PP_ST_PROC, t->role, s->leg, t->hop, at, t->send_ts, seq);
	relay_link(PP_ST_WIRE, s->role, s->leg, s->hop, at, now, seq);
}

/* the first piece into s is the hop t's forward of a kept part: its chain as measured, from its upstream send
 * (or its arrival at the hop); the hop's processing is then emitted by its send, as for any message */
static __always_inline void relay_first(struct pp_sock *s, struct pp_task *t, __u32 seq)
{
	if (t->consume_later != PP_RELAY_DEFERRED)
		return;
	relay_links(t, s->leg, t->ch_up_send ? t->ch_up_send : t->ch_ready, seq);
	t->consume_later = PP_RELAY_EMITTED;
}

#endif /* PATHPROF_RELAY_BPF_H */
