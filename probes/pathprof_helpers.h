/* pathprof.bpf.c's own maps and the helpers its programs share: per-task window freshness, stage
 * aggregation with optional span streaming (--trace-sample), socket learning. Included once, by
 * pathprof.bpf.c only (it is not a layout header: pathprof.h is). */
#ifndef PATHPROF_HELPERS_H
#define PATHPROF_HELPERS_H

#define MSG_PEEK 2
#define NET_TX_SOFTIRQ 2
#define NET_RX_SOFTIRQ 3

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct pp_task);
} tasks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct pp_sock);
} socks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);   /* skb addresses are recycled: stale entries get overwritten */
	__uint(max_entries, 8192);
	__type(key, __u64);
	__type(value, struct pp_devq);
} devq SEC(".maps");

const volatile __u32 trace_every = 0;   /* --trace-sample N: 1 in N messages per socket emits spans */
/* unused: keeps struct pp_trace in the object's BTF for the layout test (the ring buffer has no value type) */
const volatile struct pp_trace pp_trace_layout = {};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4 << 20);      /* ~130k spans: drained every 100 ms during windows */
} traces SEC(".maps");

/* A task's timestamps are valid only inside the window that set them: on its first use in a new
 * window, whatever it had pending (a send, a run-queue wait, a consumed message, a USDT start) began
 * before the window opened and is discarded -- counted, never silently. oncpu_ts = 0 then means "on CPU
 * since before the window" to sched_switch (every switch-in after the window opened is seen). */
static __always_inline struct pp_task *fresh_task(struct pp_task *t, __u64 ws)
{
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

static __always_inline struct pp_task *task_of(__u32 tid, __u64 ws)
{
	return fresh_task(bpf_map_lookup_elem(&tasks, &tid), ws);
}

static __always_inline struct pp_task *cur_task(__u32 *tid, __u64 ws)
{
	*tid = (__u32)bpf_get_current_pid_tgid();
	return task_of(*tid, ws);
}

static __always_inline void lat_add(__u8 stage, __u8 role, __u8 leg, __u32 hop, __u64 ns)
{
	__u32 idx = (((__u32)(stage - 1) * PP_NROLES + role) * PP_NLEGS + leg) * PP_MAX_HOPS + (hop & (PP_MAX_HOPS - 1));
	struct pp_hist *h = bpf_map_lookup_elem(&lat, &idx);
	if (h)
		hist_add(h, ns);
}

/* lat_add, plus one span event when the message is sampled. trace_every is a load-time constant: with
 * --trace-sample off the verifier drops this branch entirely. */
static __always_inline void span(__u8 stage, __u8 role, __u8 leg, __u32 hop, __u64 start, __u64 ns, __u32 seq)
{
	lat_add(stage, role, leg, hop, ns);
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

static __always_inline int is_hop_role(__u8 r)
{
	return r == PP_ROLE_POOLER || r == PP_ROLE_PROXY || r == PP_ROLE_QEMU || r == PP_ROLE_OTHER;
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

#define IPPROTO_TCP_NUM 6

static __always_inline __u32 tcp_copied(struct sock *sk)
{
	return BPF_CORE_READ((struct tcp_sock *)sk, copied_seq);
}

static __always_inline struct pp_sock *learn_sock(struct sock *sk, struct pp_task *t)
{
	__u64 key = (__u64)sk, cookie = bpf_get_socket_cookie(sk);
	struct pp_sock *s = bpf_map_lookup_elem(&socks, &key);
	if (s && s->cookie == cookie)
		return s;
	struct pp_sock n = { .role = t->role, .hop = t->hop, .leg = sock_leg(t->role, sk), .cookie = cookie };
	if (sk->sk_protocol == IPPROTO_TCP_NUM)
		n.copied = tcp_copied(sk);
	if (bpf_map_update_elem(&socks, &key, &n, BPF_ANY))
		stat_inc(PP_STAT_SOCKS_FULL);
	return 0;    /* a fresh socket has no pending message */
}
#endif
