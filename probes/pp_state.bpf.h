/* Configuration set before load, every map the program families share, and the helpers they all use.
 * Part of pathprof.bpf.c (one object: every family shares its maps); included in order, not alone. */
#ifndef PATHPROF_PP_STATE_BPF_H
#define PATHPROF_PP_STATE_BPF_H

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
const volatile __u32 time_lo = 1;                     /* dev.lo as its own stage (else left inside the wire) */
const volatile __u32 tap_wire = 1;                    /* the path has a qemu guest behind a tap (wire.qemu) */
/* bpf_skc_to_unix_sock (Linux 5.16): a unix stream socket's peer. 0 where the kernel lacks it (set before load, so
 * the verifier drops the call as dead code): unix sends then go without a transaction number for sampled traces,
 * and a unix sender blocked at its send buffer is not a window stall (doctor and run.json say so) */
const volatile __u32 unix_peer_ok = 1;
const volatile __u32 conn_split = 0;  /* --connect: setup exchanges are the connection probe's (conn.bpf.c), not ours */
/* no hop on the path: every backend's client connects before its first transaction (a pooler opens its server
 * connections inside its clients' transactions), so a setup message is known by its bytes whoever delivered it */
const volatile __u32 clients_connect_first = 0;
/* a client's or server's TCP send is closed at its start (pp_tcp_send), so sock_send_length need not be attached on
 * a path without hops or AF_UNIX messages: two program runs per message saved. Off with --connect. */
const volatile __u32 send_at_start = 0;
/* unused: keeps struct pp_trace in the object's BTF for the layout test (the ring buffer has no value type) */
const volatile struct pp_trace pp_trace_layout = {};

/* ---------------- task and socket storage ----------------
 * Where the kernel has them (Linux >= 5.11 for tracing programs), task- and socket-local storage: an entry lives and
 * dies with its task or socket. pathprof-510.bpf.o (-DPP_NO_LOCAL_STORAGE, for 5.8 .. 5.10: no task storage, no
 * bpf_sk_storage_get from tracing programs, no bpf_get_current_task_btf) keeps them in hash maps instead: tasks keyed
 * by thread id, sockets by the socket's address. Their entries are removed when the thread exits (pp_exit) and when
 * the socket is destroyed (pp_sk_free, at bpf_sk_storage_free), two programs attached for the whole session as pp_fork is, so that an id or an
 * address reused by a new thread or socket never finds the old one's entry; a map full refuses a new entry, counted
 * (PP_STAT_TASKS_FULL, PP_STAT_SOCKS_FULL) as a failed storage creation is. The code that uses them goes through
 * these macros:
 *   PP_TASK_STORAGE(name, V), PP_SOCK_STORAGE(name, V)   the map of values V
 *   task_get(map, p), sock_get(map, sk)                  the entry of task p / socket sk, or 0
 *   task_create(map, p, init), sock_create(map, sk, init)  ... created from *init (0: zeroed) if absent; 0 if full
 *   cur_task_ptr()                                       the current task, to pass to them (a BTF pointer >= 5.11) */
#ifndef PP_NO_LOCAL_STORAGE
#define PP_TASK_STORAGE(name, V) struct { \
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE); __uint(map_flags, BPF_F_NO_PREALLOC); \
	__type(key, int); __type(value, V); } name SEC(".maps")
#define PP_SOCK_STORAGE(name, V) struct { \
	__uint(type, BPF_MAP_TYPE_SK_STORAGE); __uint(map_flags, BPF_F_NO_PREALLOC); \
	__type(key, int); __type(value, V); } name SEC(".maps")
#define task_get(map, p) bpf_task_storage_get(map, p, 0, 0)
#define task_create(map, p, init) bpf_task_storage_get(map, p, init, BPF_LOCAL_STORAGE_GET_F_CREATE)
#define sock_get(map, sk) bpf_sk_storage_get(map, sk, 0, 0)
#define sock_create(map, sk, init) bpf_sk_storage_get(map, sk, init, BPF_SK_STORAGE_GET_F_CREATE)
#define cur_task_ptr() bpf_get_current_task_btf()
/* the current thread's entry (cur_task) */
#define cur_task_get(map) task_get(map, cur_task_ptr())
#else
#define PP_TASKS_MAX 16384    /* tracked threads: the run's processes' (pgbench, servers, hops) */
#define PP_SOCKS_MAX 16384    /* sockets tracked threads sent or received on */
#define PP_TASK_STORAGE(name, V) struct { \
	__uint(type, BPF_MAP_TYPE_HASH); __uint(map_flags, BPF_F_NO_PREALLOC); __uint(max_entries, PP_TASKS_MAX); \
	__type(key, __u32); __type(value, V); } name SEC(".maps")
#define PP_SOCK_STORAGE(name, V) struct { \
	__uint(type, BPF_MAP_TYPE_HASH); __uint(map_flags, BPF_F_NO_PREALLOC); __uint(max_entries, PP_SOCKS_MAX); \
	__type(key, __u64); __type(value, V); } name SEC(".maps")
/* bpf_get_current_task (4.8) gives the current task as a plain address, not a BTF pointer: its fields are read
 * with CO-RE probe-reads (task_tid), never loaded directly */
#define cur_task_ptr() ((struct task_struct *)bpf_get_current_task())
/* a task's thread id (the key): one probe-read, p being a BTF pointer or an address alike */
#define task_tid(p) ((__u32)BPF_CORE_READ((struct task_struct *)(p), pid))
/* all-zero source of a new entry created without an initial value (too big for the stack) */
union pp_zero_val { struct pp_task t; struct pp_holdq q; struct pp_sock s; };
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, union pp_zero_val);
} zero_val SEC(".maps");
/* the entry under *key; with create, one made from *init (0: zeroed) if there is none, unless the map is full */
static __always_inline void *pp_hash_get(void *map, void *key, void *init, int create)
{
	void *v = bpf_map_lookup_elem(map, key);
	if (v || !create)
		return v;
	if (!init) {
		__u32 zero = 0;
		init = bpf_map_lookup_elem(&zero_val, &zero);
		if (!init)
			return 0;
	}
	bpf_map_update_elem(map, key, init, BPF_NOEXIST);   /* may race another CPU: either one's entry stays */
	return bpf_map_lookup_elem(map, key);
}
#define pp_val_t(map) __typeof__((map)->value)
#define task_get(map, p) ({ __u32 __k = task_tid(p); (pp_val_t(map))pp_hash_get(map, &__k, 0, 0); })
#define task_create(map, p, init) ({ __u32 __k = task_tid(p); (pp_val_t(map))pp_hash_get(map, &__k, init, 1); })
#define sock_get(map, sk) ({ __u64 __k = (__u64)(sk); (pp_val_t(map))pp_hash_get(map, &__k, 0, 0); })
#define sock_create(map, sk, init) ({ __u64 __k = (__u64)(sk); (pp_val_t(map))pp_hash_get(map, &__k, init, 1); })
/* the current thread's entry: its id from bpf_get_current_pid_tgid, no probe-read */
#define cur_task_get(map) ({ __u32 __k = (__u32)bpf_get_current_pid_tgid(); (pp_val_t(map))pp_hash_get(map, &__k, 0, 0); })
#endif

/* ---------------- maps ---------------- */
PP_TASK_STORAGE(tasks, struct pp_task);
PP_TASK_STORAGE(holdq, struct pp_holdq);

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, PP_HOLD_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} holdts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} hold_ids SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, PP_RETX_SLOTS + 1);      /* + PP_RETX_LAST */
	__type(key, __u32);
	__type(value, struct pp_retx);
} retx SEC(".maps");

PP_SOCK_STORAGE(socks, struct pp_sock);

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
	__uint(max_entries, 4 << 20);      /* sized by user space before load (layout.trace_ring_bytes) */
} traces SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);       /* --connect: pgbench thread -> its time opening connections */
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, struct pp_connbusy);
} connbusy SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);       /* pathprof's own connections into the path (a pooler's counters): the
						* tracked processes' ends of them are never learned, so nothing on them
						* is a stage, a transaction or a sampled span. Written by user space */
	__uint(max_entries, 16);
	__type(key, struct pp_own_key);
	__type(value, __u8);
} own_conns SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);   /* qemu hop: client end of a connection -> qemu read its request */
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, __u64);
} guestq SEC(".maps");

/* ---------------- helpers ---------------- */
/* A kernel pointer as a read-only typed pointer: its fields are then plain loads (a fault reads 0), where
 * BPF_CORE_READ or bpf_probe_read_kernel is a helper call per field (~30-40 ns each on this VM). The kfunc is
 * inlined by the verifier (a register move). For pointers the program has as a scalar or under another type. */
#ifndef PP_NO_RDONLY_CAST
extern void *bpf_rdonly_cast(const void *obj, __u32 btf_id) __ksym;
#define kcast(p, T) ((T *)bpf_rdonly_cast((const void *)(p), bpf_core_type_id_kernel(T)))
/* field `f` of the kernel object of type T at p */
#define kread(p, T, f) (kcast(p, T)->f)
#else
/* pathprof-compat.bpf.o, for kernels before 6.2 (no bpf_rdonly_cast): one probe-read per field instead. A separate
 * object, not a program variant: libbpf 1.1 leaves an unresolved weak kfunc call in the program as a call to BTF
 * id 0, which the verifier of those kernels refuses even in dead code, and nearly every program reaches kcast. */
#define kread(p, T, f) ({ T *__kp = (T *)(p); BPF_CORE_READ(__kp, f); })   /* p outside the CO-RE access */
#endif

/* sk as a TCP socket (the caller knows it is one) and its fields: bpf_skc_to_tcp_sock (Linux 5.9) checks it and gives a
 * BTF pointer whose fields are plain loads; pathprof-510.bpf.o (from 5.8 on) takes sk as one and probe-reads them */
#ifndef PP_NO_LOCAL_STORAGE
#define tcp_sk_of(sk) bpf_skc_to_tcp_sock(sk)
#define tcp_field(tp, f) ((tp)->f)
#else
#define tcp_sk_of(sk) ((struct tcp_sock *)(sk))
#define tcp_field(tp, f) BPF_CORE_READ(tp, f)
#endif

/* the peer of AF_UNIX socket sk, a typed pointer (its socket storage can be looked up), or 0 (unix_peer_ok) */
static __always_inline struct sock *unix_peer(void *sk)
{
	if (!unix_peer_ok)
		return 0;
	struct unix_sock *u = bpf_skc_to_unix_sock(sk);
	return u ? u->peer : 0;
}

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

/* Is sk a tracked process's end of one of pathprof's own connections (own_conns)? Asked only of a socket with no
 * storage (a new one, or one of these, which never gets any): one lookup per new socket of a tracked thread. */
static __always_inline int own_conn(struct sock *sk)
{
	if (sk->sk_protocol != IPPROTO_TCP_NUM || !is_svc_port(sk->__sk_common.skc_num))
		return 0;
	struct pp_own_key k = { .netns = sk->__sk_common.skc_net.net->ns.inum,
				.addr = sk->__sk_common.skc_daddr,
				.port = bpf_ntohs(sk->__sk_common.skc_dport) };
	if (!bpf_map_lookup_elem(&own_conns, &k))
		return 0;
	stat_inc(PP_STAT_OWN_CONN);
	return 1;
}

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

/* Is t inside the send it began at send_ts? A client's or server's TCP send closed at its start (send_at_start)
 * has no end program to clear in_send, so it does not set it: it is under way while its socket is locked (tcp_sendmsg
 * holds the lock up to the send's end, its delivery on loopback and veth included). `into`: the socket a delivery
 * is for; a backlog drained into the socket the thread last sent on (inside its own recv) is not that send's. */
static __always_inline int sending(struct pp_task *t, __u64 into)
{
	if (t->in_send)
		return 1;
	return send_at_start && t->send_sk && t->send_sk != into && kread(t->send_sk, struct sock, sk_lock.owned);
}

/* 1 if x != 0, else 0, without a branch: the top bit of x | -x. The barrier hides -x from clang, which would
 * otherwise turn the expression back into `x != 0` (a compare and a jump: BPF has no set-on-condition) */
static __always_inline __u64 nonzero(__u64 x)
{
	__u64 neg = -x;
	asm volatile("" : "+r"(neg));
	return (x | neg) >> 63;
}

/* A task's timestamps are valid only inside the window that set them: on its first use in a new window,
 * whatever it had pending began before the window opened and is discarded -- counted, never silently.
 * oncpu_ts = 0 then means "on CPU since before the window" to sched_switch. */
static __always_inline struct pp_task *task_fresh(struct pp_task *t, __u64 ws)
{
	if (t && t->win != ws) {
		/* counted without a branch per stamp (nonzero(), below): each `!= 0` was one, and the verifier walked
		 * every combination of them (~2^11 paths, 60 % of sk_data_ready's 782k verified instructions) */
		__u64 n = t->in_send + nonzero(t->runnable_ts) + nonzero(t->consume_ts);
#pragma unroll
		for (int i = 0; i < PP_NUSDT; i++) {
			n += nonzero(t->usdt_ts[i]);
			t->usdt_ts[i] = 0;
		}
		if (n)
			stat_add(PP_STAT_WINDOW_EDGE, n);
		t->win = ws;
		t->in_send = 0;
		t->send_sk = 0;
		t->send_ts = t->wake_ts = t->oncpu_ts = t->runnable_ts = t->consume_ts = t->fwd_act = t->thr_from = 0;
		t->consume_leg = 0;       /* a hop's continued send needs a message read in this window */
		t->last_utime = t->last_stime = 0;
	}
	return t;
}

static __always_inline struct pp_task *task_of(struct task_struct *p, __u64 ws)
{
	return task_fresh(task_get(&tasks, p), ws);
}

static __always_inline struct pp_task *cur_task(__u64 ws)
{
	return task_fresh(cur_task_get(&tasks), ws);
}

/* A CPU record per (role, hop); pg_aux's hop is its kind (layout.AUX_KINDS), so the CPU view names each kind.
 * Out of range is refused and counted, never wrapped onto another role's record. */
static __always_inline struct pp_cpu_val *cpu_acc(struct pp_task *t)
{
	if (t->role >= PP_NROLES || t->hop >= PP_MAX_HOPS) {
		stat_inc(PP_STAT_CPU_FULL);
		return 0;
	}
	__u32 idx = (__u32)t->role * PP_MAX_HOPS + t->hop;
	return bpf_map_lookup_elem(&cpuacc, &idx);
}

static __always_inline int is_hop_role(__u8 r)
{
	return r == PP_ROLE_POOLER || r == PP_ROLE_PROXY || r == PP_ROLE_QEMU || r == PP_ROLE_OTHER;
}

/* One event of the `traces` ring: a span (dur > 0) or a marker (its socket's tuple filled by the caller);
 * 0 when the ring is full (counted). */
static __always_inline struct pp_trace *trace_reserve(__u8 stage, __u8 role, __u8 leg, __u32 hop, __u64 ts,
						      __u64 dur, __u32 seq)
{
	struct pp_trace *e = bpf_ringbuf_reserve(&traces, sizeof(*e), 0);
	if (!e) {
		stat_inc(PP_STAT_TRACE_LOST);
		return 0;
	}
	__u64 id = bpf_get_current_pid_tgid();
	e->ts = ts;
	e->dur = dur;
	e->pid = id >> 32;
	e->tid = (__u32)id;
	e->seq = seq;
	e->stage = stage;
	e->role = role;
	e->leg = leg;
	e->hop = hop;
	return e;
}

/* --trace-sample N: is the transaction numbered `seq` one of the 1 in N sampled? A multiplicative hash of the
 * number, a TCP sequence number every host reads alike (msg.bpf.h), so agents on different hosts sample the same
 * transactions. pathprof.agent.probing.sampling.trace_sampled mirrors it. */
static __always_inline int trace_sampled(__u32 seq)
{
	return ((seq * 2654435761u) >> 16) % trace_every == 0;
}

/* lat_add, plus one span event when the message is sampled. trace_every is a load-time constant: with
 * --trace-sample off the verifier drops this branch entirely. */
static __always_inline void trace_emit(__u8 stage, __u8 role, __u8 leg, __u32 hop, __u64 start, __u64 ns,
				       __u32 seq)
{
	if (!trace_every || !seq || !trace_sampled(seq))
		return;
	struct pp_trace *e = trace_reserve(stage, role, leg, hop, start, ns, seq);
	if (!e)
		return;
	e->laddr = e->raddr = e->tcp_seq = 0;
	e->lport = e->rport = 0;
	bpf_ringbuf_submit(e, 0);
	stat_inc(PP_STAT_TRACES);
}

/* --trace-sample: a marker of a TCP message crossing this host's edge (PP_ST_XSEND at the sender's send start,
 * PP_ST_XRECV at its delivery), for joining hosts' runs (pathprof.analysis.merge). Sampled by a hash of the TCP
 * sequence number, which every host sees identically, and also for every message of a traced transaction
 * (trace_sampled(seq), as trace_emit: a response's own sequence number is not its transaction's), so each sampled
 * transaction knows its connection's tuple and sequence numbers (its OTLP trace id,
 * pathprof.analysis.export.otlp_ids). IPv4 only. */
static __always_inline void mark_emit(__u8 stage, __u8 role, __u8 leg, __u32 hop, struct sock *sk, __u64 ts,
				      __u32 tcp_seq, __u32 seq)
{
	if (!trace_every || sk->__sk_common.skc_family != 2 /* AF_INET */)
		return;
	if (!trace_sampled(tcp_seq) && (!seq || !trace_sampled(seq)))
		return;
	struct pp_trace *e = trace_reserve(stage, role, leg, hop, ts, 0, seq);
	if (!e)
		return;
	e->laddr = BPF_CORE_READ(sk, __sk_common.skc_rcv_saddr);
	e->raddr = BPF_CORE_READ(sk, __sk_common.skc_daddr);
	e->lport = BPF_CORE_READ(sk, __sk_common.skc_num);
	e->rport = __builtin_bswap16(BPF_CORE_READ(sk, __sk_common.skc_dport));
	e->tcp_seq = tcp_seq;
	bpf_ringbuf_submit(e, 0);
	stat_inc(PP_STAT_TRACES);
}

/* The hop slot of a span: pg_aux's hop field is its kind (for the CPU view), not a hop, so its spans go to
 * slot 0 like the server's other processes. */
static __always_inline __u32 span_slot(__u8 role, __u32 hop) { return role == PP_ROLE_PG_AUX ? 0 : hop; }

/* The `lat` index of (stage, role, leg, hop slot), the only place it is computed (lat_key() in layout.py is
 * its inverse). An index outside the array as the run sized it (a hop slot >= lat_hops) is refused and
 * counted: the stride is lat_hops, so a larger slot would land in a neighbouring role's or leg's cell. */
static __always_inline int lat_index(__u8 stage, __u8 role, __u8 leg, __u32 slot, __u32 *idx)
{
	if (stage < 1 || stage > PP_LAT_STAGES || role >= PP_NROLES || leg >= PP_NLEGS || slot >= lat_hops) {
		stat_inc(PP_STAT_HOP_OVERFLOW);
		return 0;
	}
	*idx = (((__u32)(stage - 1) * PP_NROLES + role) * PP_NLEGS + leg) * lat_hops + slot;
	return 1;
}

/* A global function, verified once per program on its own, at ~1.3 ns a call here (bench/bpf_helpers): inlined at
 * each of its call sites, its histogram slot's branches were walked again at each. At most five arguments: the
 * cell comes packed. */
static __always_inline __u64 overlap_ns(__u64 s, __u64 e, __u64 a, __u64 b)
{
	__u64 lo = s > a ? s : a, hi = e < b ? e : b;
	return hi > lo ? hi - lo : 0;
}

__noinline int span_cell(__u64 cell, __u64 start, __u64 ns, __u32 seq)
{
	__u8 stage = cell & 0xff, role = (cell >> 8) & 0xff, leg = (cell >> 16) & 0xff;
	__u32 idx, slot = span_slot(role, cell >> 32);
	if (!lat_index(stage, role, leg, slot, &idx))
		return 0;
	/* CPU quota: the part of the span the running thread spent held off CPU by its cgroup's throttle is its own
	 * stage, whichever wait or work it fell in (a run queue, a message queued behind it, its processing) */
	__u32 zero = 0;
	struct pp_cpu_state *cs = bpf_map_lookup_elem(&cpust, &zero);
	if (cs && cs->thr0_e > start && ns) {
		__u64 end = start + ns;
		__u64 t = overlap_ns(start, end, cs->thr0_s, cs->thr0_e) + overlap_ns(start, end, cs->thr1_s, cs->thr1_e);
		/* the older intervals: all of their sum when the span holds their whole stretch, else its share of
		 * the stretch it holds (the quota's runs between are short and even). Bounded at the span's end too: a
		 * request's last wait is closed at the reply's send (msg.bpf.h), after the work whose throttles these
		 * are; charged to both, a capped guest's run closed at +52 ... +69 % (2026-11-28) */
		if (cs->thro_ns && start < cs->thro_e && end > cs->thro_s)
			t += start <= cs->thro_s && end >= cs->thro_e ? cs->thro_ns :
			     cs->thro_ns * overlap_ns(start, end, cs->thro_s, cs->thro_e) / (cs->thro_e - cs->thro_s);
		if (t) {
			t = t < ns ? t : ns;
			ns -= t;
			struct pp_stage_key k = { .stage = PP_ST_THROTTLED, .role = cs->thr_role, .leg = leg,
						  .hop = cs->thr_hop };
			stage_add(&k, t);
			trace_emit(PP_ST_THROTTLED, cs->thr_role, leg, span_slot(cs->thr_role, cs->thr_hop),
				   start, t, seq);
		}
	}
	struct pp_hist *h = bpf_map_lookup_elem(&lat, &idx);
	if (h)
		hist_add(h, ns);
	trace_emit(stage, role, leg, slot, start, ns, seq);
	return 0;
}

static __always_inline void span(__u8 stage, __u8 role, __u8 leg, __u32 hop, __u64 start, __u64 ns, __u32 seq)
{
	span_cell((__u64)stage | (__u64)role << 8 | (__u64)leg << 16 | (__u64)hop << 32, start, ns, seq);
}

/* IPv4/TCP tuple and payload length of the IP header at p; 0 when not IPv4/TCP.
 * Plain loads through a read-only cast (kcast: a faulting load reads 0, which fails the version check), not
 * bpf_probe_read_kernel: a helper call costs ~30-40 ns per run on this VM (bench/bpf_helpers), and this runs
 * in every netfilter bracket and device program. Bitfields are read as the byte that holds them. */
struct pp_tuple { __u32 saddr, daddr; __u16 sport, dport; __u32 payload; };

#ifdef PP_NO_RDONLY_CAST
/* the same from two probe-reads of the headers as bytes (wire formats: no CO-RE needed) */
static __always_inline int ip_tuple(unsigned char *p, struct pp_tuple *t)
{
	__u8 ip[20], th[20];
	if (bpf_probe_read_kernel(ip, sizeof(ip), p) || (ip[0] >> 4) != 4 || ip[9] != IPPROTO_TCP_NUM)
		return 0;
	__u32 ihl = (ip[0] & 0xf) * 4;
	if (bpf_probe_read_kernel(th, sizeof(th), p + ihl))
		return 0;
	__builtin_memcpy(&t->saddr, &ip[12], 4);
	__builtin_memcpy(&t->daddr, &ip[16], 4);
	t->sport = (__u16)th[0] << 8 | th[1];
	t->dport = (__u16)th[2] << 8 | th[3];
	__u32 doff = (th[12] >> 4) * 4;
	__u32 tot = (__u32)ip[2] << 8 | ip[3], hl = ihl + doff;
	t->payload = tot > hl ? tot - hl : 0;
	return 1;
}
#else
static __always_inline int ip_tuple(unsigned char *p, struct pp_tuple *t)
{
	struct iphdr *ip = kcast(p, struct iphdr);
	__u8 vihl = *(__u8 *)ip;          /* version (high nibble), ihl (low) */
	if ((vihl >> 4) != 4 || ip->protocol != IPPROTO_TCP_NUM)
		return 0;
	__u32 ihl = (vihl & 0xf) * 4;
	struct tcphdr *th = kcast(p + ihl, struct tcphdr);
	t->saddr = ip->saddr;
	t->daddr = ip->daddr;
	t->sport = bpf_ntohs(th->source);
	t->dport = bpf_ntohs(th->dest);
	__u32 doff = (*((__u8 *)th + 12) >> 4) * 4;   /* data offset: the high nibble of byte 12 */
	__u32 tot = bpf_ntohs(ip->tot_len), hl = ihl + doff;
	t->payload = tot > hl ? tot - hl : 0;
	return 1;
}
#endif

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

#endif /* PATHPROF_PP_STATE_BPF_H */
