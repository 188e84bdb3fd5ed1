/* Messages: send -> ready -> consumed -> next send, on TCP and AF_UNIX sockets, and their trace numbers.
 * Part of pathprof.bpf.c (one object: every family shares its maps); included in order, not alone. */
#ifndef PATHPROF_MSG_BPF_H
#define PATHPROF_MSG_BPF_H

/* A client's request after its reply (a new transaction on the connection): between two of them on one
 * connection lies exactly one transaction, its legs and the client's own work, so the time from a connection's
 * first request in a window to its last, summed over the connections, over the transactions between (those
 * counted less one per connection), is the cycle the stages tile -- whatever the connections idle outside it.
 * attach has no pgbench log: an idle pooled connection counted as a client halved its cycle (-50 %). */
static __always_inline void client_cycle(struct pp_sock *s, __u64 at, __u64 ws)
{
	if (!at || at < ws)
		return;
	if (s->cycle_ws != ws) {
		s->cycle_ws = ws;
		stat_inc(PP_STAT_CLIENT_CONNS);
	} else if (at > s->cycle_last) {
		stat_add(PP_STAT_CLIENT_CYCLE_NS, at - s->cycle_last);
	}
	s->cycle_last = at;
}

/* --trace-sample: the number a message carries, so every message of one transaction has the same one and the
 * sample (trace_sampled(number), pp_state.bpf.h) takes all of them: a client's request opens a new number, a backend
 * answers with the request's, a hop forwards the one it consumed. On TCP the number is the sequence number of the
 * request's first byte on the client's connection (the client's write_seq at its send start, the receiver's
 * copied_seq at its delivery), which every host on the path reads alike: agents on different hosts number a
 * transaction alike and sample the same ones. AF_UNIX: the connection's last + 1. Only runs with traces on. */
static __always_inline __u32 send_number(struct sock *sk, struct pp_task *t)
{
	if (is_hop_role(t->role)) {
		struct pp_sock *u = sk ? sock_get(&socks, sk) : 0;
		__u32 held = u && u->leg == PP_LEG_RESPONSE ? hold_peek_seq(cur_task_ptr()) : 0;
		return held ? held : t->consume_seq;   /* upstream: the held request this send will take */
	}
	if (t->role == PP_ROLE_PGBENCH && sk && sk->sk_protocol == IPPROTO_TCP_NUM)
		return BPF_CORE_READ((struct tcp_sock *)sk, write_seq);
	struct pp_sock *s = sk ? sock_get(&socks, sk) : 0;
	if (!s)
		return 0;
	return t->role == PP_ROLE_PGBENCH ? s->seq + 1 : s->seq;
}

/* --trace-sample, TCP: the number of a message delivered into `s` whose sender this agent does not see (on another
 * host): a request's first byte (copied_seq, the queue drained), an answer the number of the request last sent on
 * the socket (pp_tcp_send keeps it), else the socket's next. */
static __always_inline __u32 delivery_number(struct sock *sk, struct pp_sock *s, __u32 next)
{
	if (s->leg == PP_LEG_RESPONSE)
		return s->sent_seq ? s->sent_seq : next;
	return BPF_CORE_READ((struct tcp_sock *)sk, copied_seq);
}

/* ---------------- --connect: the setup exchange belongs to the connection probe ----------------
 * With a new connection per transaction, conn.bpf.c times the client's connect() up to its read of the first
 * ReadyForQuery (handshake, accept, fork, backend start-up and authentication, delivery). The messages of that
 * exchange (SSLRequest and its 1-byte refusal, the startup packet, the server's hello up to ReadyForQuery) are
 * left out of the per-message stages, or they would be counted twice. The client's work after reading the
 * hello (-> its first query) stays: the connection probe's split ends at that read. */
#define PP_TCP_ESTABLISHED 1   /* enum tcp_state: the FIN of the peer moves it to CLOSE_WAIT */
#define PP_SETUP_READY 1   /* the message pending on the socket (ready, not consumed) is a setup message */
#define PP_SETUP_PEND  2   /* the consumed message kept in pend_* is one */
#define PP_SETUP_LAST  4   /* ... and it was the server's hello: the client's next send is its first query */
/* Without --connect, pgbench opens every connection before its first transaction and holds each thread at a
 * barrier until all are open; its latencies leave that phase out. The wait from its read of the server's hello
 * to its first query is that barrier (a second, or three, when a SYN or a startup message was lost), not the
 * client's work of a transaction: its span is left out. The hello is the first read of more than one byte on a
 * socket that had read at most the 1-byte SSL refusal before it (trust authentication; with a password exchange
 * that read is the server's first challenge, and the first query keeps its span, as before). */
#define PP_SETUP_HELLO 8   /* pgbench, no --connect: the hello was read; its next send is its first query */
#define PP_SETUP_SEEN  16  /* ... its first read of more than one byte happened: nothing more to look for */

/* pgbench's thread `tid`: ns spent opening connections up to `now` (libpq's connect blocks the thread: a reply to
 * another of its clients that is ready meanwhile waits for it) */
static __always_inline __u64 conn_busy_at(__u32 tid, __u64 now)
{
	struct pp_connbusy *b = bpf_map_lookup_elem(&connbusy, &tid);
	if (!b)
		return 0;
	/* a start from before the window: its end was not seen (the programs were detached) */
	return b->busy + (b->start >= win_start() && now > b->start ? now - b->start : 0);
}

/* pgbench's thread starts (start = 1: its TCP connect, SYN_SENT; 2: its first send on a new socket, which starts
 * the connect only where no SYN_SENT did: a unix socket) or ends (its read of the hello) a connect */
static __always_inline void conn_busy_mark(__u32 tid, __u64 now, int start)
{
	struct pp_connbusy *b = bpf_map_lookup_elem(&connbusy, &tid);
	if (!b) {
		struct pp_connbusy n = {};
		bpf_map_update_elem(&connbusy, &tid, &n, BPF_NOEXIST);
		b = bpf_map_lookup_elem(&connbusy, &tid);
		if (!b)
			return;
	}
	if (start == 2 && b->start >= win_start() && b->start <= now)
		return;                       /* the connect began at its SYN: the handshake's wait is the thread's too */
	if (!start && b->start && now > b->start)
		b->busy += now - b->start;
	b->start = start ? now : 0;
}

/* --connect: pgbench's thread begins a TCP connect. libpq's connect blocks the thread from here, through the
 * handshake (a lost SYN: 1 s and more); a reply to another of its clients that is ready meanwhile waits for it
 * (connwait), not for the CPU to leave idle. Attached only with --connect. */
SEC("tp_btf/inet_sock_set_state")
int BPF_PROG(pp_syn_sent, const struct sock *sk, const int oldstate, const int newstate)
{
	if (newstate != TCP_SYN_SENT || !conn_split)
		return 0;
	__u64 ws = win_start();
	if (!ws)
		return 0;
	struct pp_task *t = cur_task(ws);
	if (t && t->role == PP_ROLE_PGBENCH)
		conn_busy_mark((__u32)bpf_get_current_pid_tgid(), bpf_ktime_get_ns(), 1);
	return 0;
}

static __always_inline int setup_message(struct sock *sk, struct pp_sock *s, struct pp_task *sender)
{
	if (!conn_split)
		return 0;
	if (s->setup)                     /* into a backend that has not sent its hello yet */
		return 1;
	/* a pooler's own message on its server connection (pgbouncer's reset query when a client leaves, the SETs
	 * that give the next client its parameters), and the backend's answer to it: no client waits for them, they
	 * run while pgbench connects again (delivery inside the sender's send: loopback, veth) */
	if (sender && sender->in_send) {
		if (s->role == PP_ROLE_BACKEND && is_hop_role(sender->role) && sender->own_msg)
			return 1;
		if (is_hop_role(s->role) && sender->role == PP_ROLE_BACKEND && sender->setup_reply)
			return 1;
	}
	if (s->role == PP_ROLE_BACKEND)
		return 0;
	if (sk->sk_protocol == IPPROTO_TCP_NUM) {
		struct tcp_sock *tp = (struct tcp_sock *)sk;
		if (is_svc_port(sk->__sk_common.skc_num)) {
			/* a hop's end of a client's connection that has written at most the 1-byte SSL refusal: the
			 * client's SSLRequest or startup packet (bytes written = queued + acknowledged) */
			__u64 written = BPF_CORE_READ(tp, write_seq) - BPF_CORE_READ(tp, snd_una) + BPF_CORE_READ(tp, bytes_acked);
			return written <= 1;
		}
		/* into a client (pgbench, a hop's upstream) that has read at most the 1-byte SSL refusal: the refusal or
		 * the hello */
		__u64 read = BPF_CORE_READ(tp, bytes_received) - (BPF_CORE_READ(tp, rcv_nxt) - BPF_CORE_READ(tp, copied_seq));
		return read <= 1;
	}
	if (s->role != PP_ROLE_PGBENCH)
		return 0;
	/* AF_UNIX is delivered inside the sender's send: a backend before its hello is sending part of the setup */
	return sender && sender->role == PP_ROLE_BACKEND && sender->conn_setup;
}

/* No --connect: pgbench connects every client before its first transaction and its latencies leave that phase out,
 * so a backend's setup exchange with pgbench itself (the SSL refusal, the startup packet, the hello) is no
 * transaction's either: a cold backend in a small CPU quota took 0.8 s over it, +33 % on a 4-s run's closure (a
 * guest on 6.1). Left out as with --connect, over TCP where its sender is known at the delivery (in the sender's
 * send: loopback, veth; AF_UNIX left its start unseen, so never counted it). Told by the bytes the socket moved, not
 * by when a window opened: a backend's socket that has written at most the 1-byte SSL refusal, a pgbench socket that
 * has read at most that. A pooler's server connection, opened inside a client's transaction, keeps its stages: a
 * client waits for it. Returns 1 for a setup message (into the backend: PP_SETUP_READY, its wait and the backend's
 * answer are left out; into pgbench: its wire, and with sends closed at their end the backend's answer: setup_peer). */
static __always_inline int setup_of_pgbench(struct sock *sk, struct pp_sock *s, struct pp_task *sender)
{
	if (conn_split || (s->setup_msg & PP_SETUP_SEEN) || sk->sk_protocol != IPPROTO_TCP_NUM)
		return 0;
	/* delivered outside its sender's send (a softirq deferred to ksoftirqd: a busy emulated guest), the sender is
	 * not known: on a path without hops a backend's client and pgbench's server are each other (or pathprof's own
	 * connections, whose setup is no transaction's either) */
	int known = sender && sending(sender, (__u64)sk);
	if (!known && !clients_connect_first)
		return 0;
	int to_backend = s->role == PP_ROLE_BACKEND && (!known || sender->role == PP_ROLE_PGBENCH);
	if (!to_backend && !(s->role == PP_ROLE_PGBENCH && (!known || sender->role == PP_ROLE_BACKEND)))
		return 0;
	struct tcp_sock *tp = tcp_sk_of(sk);
	if (!tp)
		return 0;
	if (to_backend) {             /* bytes the backend wrote (queued + acknowledged) */
		if (tcp_field(tp, write_seq) - tcp_field(tp, snd_una) + tcp_field(tp, bytes_acked) <= 1)
			return 1;
		s->setup_msg |= PP_SETUP_SEEN;   /* past its setup: not looked at again */
		return 0;
	}
	/* bytes pgbench read before this message (pgbench's own PP_SETUP_SEEN comes with its first long read) */
	if (tcp_field(tp, bytes_received) - (tcp_field(tp, rcv_nxt) - tcp_field(tp, copied_seq)) > 1)
		return 0;
	if (!send_at_start && known)  /* closed at its start, its answer's spans are out already (PP_SETUP_PEND) */
		sender->setup_peer = 1;
	return 1;
}

/* ---------------- messages: send -> ready -> consumed -> next send ----------------
 * TCP send start: the first tcp_sendmsg_locked of the send (a few hundred ns after the syscall entry; syscall
 * tracepoints would put every syscall of every process on the slow path). AF_UNIX has no such tracepoint: its
 * send start is taken at the receiver's sk_data_ready. */
/* --connect: is the send starting a hop's own message upstream (nothing held or read from a client to forward:
 * its reset after a client left, its SETs for the next one), or a backend's answer to a setup message or to such
 * a message? setup_message() reads it at the delivery, inside this send */
#define PP_OWN_IDLE 1   /* no client request held: a reset after a client left */
#define PP_OWN_HELD 2   /* a request held waits for it: pgbouncer reads a new client's first query, then SETs the
			 * client's parameters (application_name) on the server connection before it forwards it */

/* A send upstream while a request is held that is not that request's forward: one whole simple Query ('Q' and
 * its length, the send's size) of another size than the bytes read of the request. A pooler forwards what it
 * read as it is, or in parts that are not simple queries (pgpool: Parse, Bind ... apart) */
/* struct iov_iter before Linux 6.4 named its iovec pointer `iov` (then `__iov`); the iter_type values moved too */
struct iov_iter___pre64 {
	const struct iovec *iov;
} __attribute__((preserve_access_index));
struct iov_iter___pre514 {
	unsigned int type;
} __attribute__((preserve_access_index));

static __always_inline int own_query(const struct msghdr *msg, __u32 held_len)
{
	__u64 count = msg->msg_iter.count;
	const void *base;
	if (count == held_len || count < 5 || count > 4096)
		return 0;
#ifdef PP_PRE_518
	/* before 5.14 the kind of iterator was `type`, its values (ITER_IOVEC 4, ...) or'ed with the direction
	 * (bit 0); no ITER_UBUF before 6.0 (the old kernels' object, pathprof-510.bpf.o, serves 5.8 to 5.17) */
	__u32 type = bpf_core_field_exists(msg->msg_iter.iter_type) ? msg->msg_iter.iter_type :
		BPF_CORE_READ((struct iov_iter___pre514 *)&msg->msg_iter, type) & ~1u;
	if (bpf_core_enum_value_exists(enum iter_type, ITER_UBUF) &&
	    type == bpf_core_enum_value(enum iter_type, ITER_UBUF)) {
		base = msg->msg_iter.ubuf;
	}
#else
	__u8 type = msg->msg_iter.iter_type;
	if (type == bpf_core_enum_value(enum iter_type, ITER_UBUF)) {
		base = msg->msg_iter.ubuf;
	}
#endif
	else if (type == bpf_core_enum_value(enum iter_type, ITER_IOVEC)) {
		struct iovec v;
		const struct iovec *iov = bpf_core_field_exists(msg->msg_iter.__iov) ? msg->msg_iter.__iov :
			BPF_CORE_READ((struct iov_iter___pre64 *)&msg->msg_iter, iov);
		if (bpf_probe_read_kernel(&v, sizeof(v), iov) || v.iov_len < 5)
			return 0;
		base = v.iov_base;
	} else {
		return 0;
	}
	__u8 h[5];
	if (bpf_probe_read_user(h, sizeof(h), base))
		return 0;
	__u32 len = (__u32)h[1] << 24 | (__u32)h[2] << 16 | (__u32)h[3] << 8 | h[4];
	return h[0] == 'Q' && (__u64)len + 1 == count;
}

static __always_inline void own_or_reply(const struct sock *sk, const struct msghdr *msg, struct pp_task *t,
					 __u64 ws)
{
	struct pp_sock *u = sock_get(&socks, (struct sock *)sk);
	t->own_msg = 0;
	t->setup_reply = 0;
	if (!u)
		return;
	if (is_hop_role(t->role) && u->leg == PP_LEG_RESPONSE) {
		/* only a valid entry is held: a stale one (superseded, answered, from before the window) is not */
		struct pp_hold *e = hold_peek(cur_task_ptr(), ws);
		if (e)
			t->own_msg = own_query(msg, e->len) ? PP_OWN_HELD : 0;
		else
			t->own_msg = t->consume_setup || !t->consume_ts ? PP_OWN_IDLE : 0;
	} else if (t->role == PP_ROLE_BACKEND) {
		t->setup_reply = (u->setup_msg & PP_SETUP_PEND) && !(u->setup_msg & PP_SETUP_LAST);
	}
}

static __always_inline int send_over(struct sock *sk, struct pp_task *t, __u64 ws, int ret, int was_sending);

/* A TCP send begins, its socket locked: the tcp_sendmsg_locked tracepoint (Linux >= 6.3: at the first skb it
 * fills), or fentry on tcp_sendmsg_locked itself on older kernels (a few instructions earlier, same lock held) */
static __always_inline int on_tcp_send(const struct sock *sk, const struct msghdr *msg)
{
	__u64 ws = win_start();
	if (!ws)
		return 0;
	struct pp_task *t = cur_task(ws);
	if (t && !t->in_send) {
		/* a client's or server's send is closed here (send_at_start): in_send stays clear, see sending() */
		int close_now = send_at_start && !is_hop_role(t->role);
		t->send_ts = bpf_ktime_get_ns();
		t->in_send = !close_now;
		t->send_sk = close_now ? (__u64)sk : 0;
		struct pp_sock *u = trace_every ? sock_get(&socks, (struct sock *)sk) : 0;
		if (trace_every && (u || !own_conn((struct sock *)sk))) {   /* no marker on pathprof's own */
			t->send_seq = send_number((struct sock *)sk, t);
			if (u && u->leg == PP_LEG_RESPONSE)
				u->sent_seq = t->send_seq;   /* a request: its answer takes its number */
			mark_emit(PP_ST_XSEND, t->role, u ? (u->leg == PP_LEG_REQUEST ? PP_LEG_RESPONSE : PP_LEG_REQUEST)
				  : (t->role == PP_ROLE_PGBENCH ? PP_LEG_REQUEST : PP_LEG_RESPONSE), t->hop,
				  (struct sock *)sk, t->send_ts, BPF_CORE_READ((struct tcp_sock *)sk, write_seq),
				  t->send_seq);
		}
		/* a hop sending again with no read since its last send (whose delivery is cont_ts) and no sleep either
		 * goes on working on the same message (pgpool sends a reply's piece to the client, then the next request
		 * to the backend): this send's processing starts where the last one was delivered, on the leg of the
		 * message it last read in this window (none read yet: the window opened inside that work) */
		if (is_hop_role(t->role) && !t->consume_ts && t->consume_leg && t->cont_ts >= ws &&
		    t->wake_ts < t->cont_ts && t->send_ts > t->cont_ts) {
			t->consume_ts = t->cont_ts;
			stat_inc(PP_STAT_HOP_CONTINUED);
		}
		if (conn_split)
			own_or_reply(sk, msg, t, ws);
		if (close_now)
			send_over((struct sock *)sk, t, ws, msg->msg_iter.count, 1);
	}
	return 0;
}

SEC("tp_btf/tcp_sendmsg_locked")
int BPF_PROG(pp_tcp_send, const struct sock *sk, const struct msghdr *msg, const struct sk_buff *skb, int goal)
{
	return on_tcp_send(sk, msg);
}

SEC("fentry/tcp_sendmsg_locked")
int BPF_PROG(pp_tcp_send__fentry, struct sock *sk, struct msghdr *msg, size_t size)
{
	return on_tcp_send(sk, msg);
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
	return kread(sk, struct tcp_sock, copied_seq);   /* a load, not a probe-read call (where the kernel allows) */
}

/* the socket's storage, created on first use by a tracked thread; 0 for a fresh socket (nothing pending) */
static __always_inline struct pp_sock *learn_sock(struct sock *sk, struct pp_task *t)
{
	struct pp_sock *s = sock_get(&socks, sk);
	if (s || own_conn(sk))
		return s;             /* pathprof's own connection: never known, so nothing on it is measured */
	struct pp_sock n = { .role = t->role, .hop = t->hop, .leg = sock_leg(t->role, sk),
			     .setup = t->role == PP_ROLE_BACKEND && t->conn_setup };
	if (conn_split && t->role == PP_ROLE_PGBENCH)
		n.owner = (__u32)bpf_get_current_pid_tgid();
	if (sk->sk_protocol == IPPROTO_TCP_NUM)
		n.copied = tcp_copied(sk);
	if (!sock_create(&socks, sk, &n))
		stat_inc(PP_STAT_SOCKS_FULL);
	return 0;
}

#ifdef PP_NO_LOCAL_STORAGE
/* pathprof-510.bpf.o: a socket's entry in the hash that stands in for socket storage (pp_state.bpf.h) goes where socket
 * storage would: bpf_sk_storage_free, called from __sk_destruct for every socket of every family, before its memory
 * (and so its address) can be reused. Not sk_free: TCP calls it on a live socket to drop a write-memory reference
 * (tcp_wfree), which emptied the hash under a run on 5.10 (every message's socket unknown). Attached for the whole
 * session, as pp_fork is. */
SEC("fentry/bpf_sk_storage_free")
int BPF_PROG(pp_sk_free, struct sock *sk)
{
	__u64 k = (__u64)sk;
	bpf_map_delete_elem(&socks, &k);
	return 0;
}

SEC("kprobe/bpf_sk_storage_free")    /* the same where fentry is refused */
int BPF_KPROBE(pp_sk_free__kprobe, struct sock *sk)
{
	__u64 k = (__u64)sk;
	bpf_map_delete_elem(&socks, &k);
	return 0;
}
#endif

/* A message (or a piece of one) was queued on sk and its reader woken. Reached from the sk_data_ready tracepoint
 * (Linux >= 6.3) or, on older kernels, from fentry on sock_def_readable: the callback that fires that tracepoint
 * and the sk_data_ready of every TCP and AF_UNIX stream socket on pathprof's paths (pathprof.agent.probing.hooks). */
static __always_inline int on_data_ready(struct sock *sk)
{
	__u64 ws = win_start();
	if (!ws)
		return 0;
	struct pp_sock *s = sock_get(&socks, sk);
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
	/* pathprof-510.bpf.o (no cmpxchg, hist.bpf.h pp_cas): a race seen after the store is counted alike; one whose
	 * loads and stores interleave lets both CPUs on, the later overwriting the message's start and seq */
	if (pp_cas(&s->ready_ts, old, now) != old) {
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
	if (!more && trace_every && sk->sk_protocol == IPPROTO_TCP_NUM)
		s->seq = seq = delivery_number(sk, s, seq);
	if (!more && trace_every && t) {  /* the sender's transaction number, where the sender is known */
		int is_unix = sk->__sk_common.skc_family == AF_UNIX_NUM;
		if (is_unix && !t->in_send) { /* AF_UNIX: its send starts here; the sender's socket is the peer */
			struct sock *peer = unix_peer(sk);
			t->send_seq = peer ? send_number(peer, t) : 0;
		}
		if ((t->in_send || is_unix) && t->send_seq)
			s->seq = seq = t->send_seq;
	}
	if (!more && trace_every && sk->sk_protocol == IPPROTO_TCP_NUM)   /* the queue was drained: copied_seq is
									     * the message's first byte */
		mark_emit(PP_ST_XRECV, s->role, s->leg, s->hop, sk, now, tcp_copied(sk), seq);
	int setup = 0;                    /* --connect: a setup message, whose wire is the connection probe's */
	if (conn_split) {
		setup = setup_message(sk, s, t);
		if (setup) {
			s->setup_msg |= PP_SETUP_READY;   /* its wait and the receiver's answer are not ours either */
			stat_inc(PP_STAT_SETUP_SPANS);
		} else if (!more) {
			s->setup_msg &= ~PP_SETUP_READY;
		}
		if (s->owner)                 /* the reply's wait starts now: how busy its thread was until now */
			s->ready_busy = conn_busy_at(s->owner, now);
	} else if (!more && setup_of_pgbench(sk, s, t)) {
		setup = 1;
		if (s->role == PP_ROLE_BACKEND)
			s->setup_msg |= PP_SETUP_READY;   /* consumed: PP_SETUP_PEND, left out at the answer */
		stat_inc(PP_STAT_SETUP_SPANS);
	}
	/* a request/response receiver that has not answered since this message's first piece: a further piece */
	int piece = !is_hop_role(s->role);
	if (piece && s->piece_ts >= ws && s->piece_ts <= now && !setup) {
		piece_more(sk, s, t, ws, now, seq, sk->sk_protocol == IPPROTO_TCP_NUM);
		piece_mark(sk, s, t, now);
		return 0;
	}
	if (piece)
		piece_mark(sk, s, t, now);
	/* a later part of a reply into a hop: no stage here, its last receiver accounts it (relay.bpf.h) */
	int relayed = !setup && relay_ready(sk, s, t, ws);
	setup |= relayed;
	__u64 qs = qdisc_on ? qdisc_send_start(ws) : 0;   /* out of a netem qdisc: sent from elsewhere, earlier */
	int tcp = sk->__sk_common.skc_family != AF_UNIX_NUM;
	int retx_first = tcp && retx_recent(ws);   /* tcp_loss.bpf.h: before a send start taken from another task */
	if (retx_first && retx_delivered(sk, s, ws, now, seq, setup, 0)) {
		/* a retransmission of the run's: its wait and its own trip emitted */
	} else if (qs && now > qs) {
		if (!setup)
			span(PP_ST_WIRE, s->role, s->leg, s->hop, qs, now - qs, seq);
	} else if (t && sending(t, (__u64)sk) && now > t->send_ts) {
		if (!setup && is_hop_role(t->role))
			relay_first(s, t, seq);   /* a first piece out of a later part the hop kept */
		if (!setup)
			span(PP_ST_WIRE, s->role, s->leg, s->hop, t->send_ts, now - t->send_ts, seq);
		if (t->role == PP_ROLE_QEMU)
			t->in_send = 0;           /* a tap write has no sock_send_length (pp_tap_recv) */
		t->cont_ts = now;             /* a hop's next send without a read in between continues from here */
	} else if (t && !t->in_send && sk->__sk_common.skc_family == AF_UNIX_NUM) {
		t->send_ts = now;             /* unix: the send path up to here stays in the sender's stage */
		t->in_send = 1;
		stat_inc(PP_STAT_WIRE_UNTIMED);
	} else if (!(tcp && !retx_first && retx_delivered(sk, s, ws, now, seq, setup, 0)) && !relayed) {
		stat_inc(PP_STAT_WIRE_UNPAIRED);
	}
	return 0;
}

SEC("tp_btf/sk_data_ready")
int BPF_PROG(pp_sk_data_ready, const struct sock *csk)
{
	return on_data_ready((struct sock *)csk);
}

SEC("fentry/sock_def_readable")
int BPF_PROG(pp_sk_data_ready__fentry, struct sock *sk)
{
	return on_data_ready(sk);
}

/* the ready -> consumed stages of one piece: woken (onto an idle or a busy CPU), run queue, receive; or queued
 * when the receiver was already awake (w = 0) */
static __always_inline __u64 carve(__u64 *part, __u64 busy)
{
	__u64 x = busy < *part ? busy : *part;
	*part -= x;
	return busy - x;
}

/* busy (--connect): ns of the wait during which the receiver's thread was opening another connection, carved out
 * of the wait (first out of the wakeup, then the receive, then the run queue) as PP_ST_CONNWAIT */
static __always_inline void piece_spans(struct pp_sock *s, __u64 r, __u64 w, __u64 on, __u64 done, __u8 idle,
					__u32 seq, __u64 busy)
{
	if (busy > done - r)
		busy = done - r;
	if (busy) {
		struct pp_stage_key k = { .stage = PP_ST_CONNWAIT, .role = s->role, .leg = s->leg, .hop = s->hop };
		stage_add(&k, busy);
		stat_inc(PP_STAT_CONN_WAIT);
	}
	if (w) {
		__u64 a = w - r, b = on - w, c = done - on;
		busy = carve(&a, busy);
		busy = carve(&c, busy);
		carve(&b, busy);
		span(idle ? PP_ST_IDLE_EXIT : PP_ST_WAKEUP, s->role, s->leg, s->hop, r, a, seq);
		span(PP_ST_RUNQUEUE, s->role, s->leg, s->hop, w, b, seq);
		span(PP_ST_RECV, s->role, s->leg, s->hop, on, c, seq);
	} else {
		span(PP_ST_QUEUED, s->role, s->leg, s->hop, r, done - r - busy, seq);
	}
}

/* t consumed the message pending on sk: close its ready -> consumed stages (wakeup, runqueue, recv, or queued)
 * and remember the consume for the processing that follows -- on the socket for request/response roles, on
 * the thread for hops. A hop (pgbouncer, a pgpool child, docker-proxy, qemu) consumes on one socket and
 * forwards on another, so its processing pairs a send with the most recent consume by the same thread that no
 * send has claimed yet: an event loop forwards what it read before it reads the next; Go's docker-proxy copies
 * each direction in one goroutine (splice in, splice out, back to back on one thread). */
static __always_inline void on_consume(struct sock *sk, struct pp_task *t, __u64 ws, int tcp, int bytes)
{
	struct pp_sock *s = learn_sock(sk, t);
	if (!s)
		return;
	__u32 moved = 0;
	if (tcp) {
		__u32 c = tcp_copied(sk);
		if (c == s->copied)
			return;                   /* nothing was moved */
		moved = c - s->copied;
		s->copied = c;
	}
	/* --connect, a hop: a setup message, or the client's Terminate ('X' + length: 5 bytes), which the client does
	 * not wait for (it closes and goes on): neither its wait here nor its forwarding is on the client's path. Read
	 * together with the FIN that follows it at once (a hop woken late, Go's docker-proxy) it moves 6: the FIN
	 * takes a sequence number of its own, and the socket is past ESTABLISHED; read after it, the FIN alone moves 1 */
	int fin = tcp && sk->__sk_common.skc_state != PP_TCP_ESTABLISHED;
	int terminate = moved == 5 || (fin && moved == 6);
	/* the peer's FIN alone, either way: a connection's end, no message. Upstream it is the backend exiting after
	 * the client's Terminate, read by the hop while the client is already opening its next connection */
	int closing = fin && moved == 1;
	int off_path = conn_split && is_hop_role(t->role) &&
		       ((s->setup_msg & PP_SETUP_READY) || closing || (terminate && s->leg == PP_LEG_REQUEST));
	if ((conn_split || (s->setup_msg & PP_SETUP_READY)) && !is_hop_role(t->role)) {
		/* a setup message read: left out at the next send; a client's read of more than the 1-byte SSL
		 * refusal is the server's hello, which ends the setup (without --connect only a backend's socket
		 * has setup messages: setup_of_pgbench) */
		__u8 m = s->setup_msg & PP_SETUP_READY;
		s->setup_msg = m ? PP_SETUP_PEND | (t->role == PP_ROLE_PGBENCH && bytes > 1 ? PP_SETUP_LAST : 0) : 0;
		if (s->setup_msg & PP_SETUP_LAST)
			conn_busy_mark((__u32)bpf_get_current_pid_tgid(), bpf_ktime_get_ns(), 0);   /* connected */
	} else if (t->role == PP_ROLE_PGBENCH && bytes > 1 && !(s->setup_msg & PP_SETUP_SEEN) &&
		   sk->sk_protocol == IPPROTO_TCP_NUM) {
		struct tcp_sock *tp = tcp_sk_of(sk);
		if (tp) {                     /* bytes read on the socket, this read included */
			__u64 read = tcp_field(tp, bytes_received) - (tcp_field(tp, rcv_nxt) - tcp_field(tp, copied_seq));
			s->setup_msg |= PP_SETUP_SEEN | (read <= (__u64)bytes + 1 ? PP_SETUP_HELLO : 0);
		}
	}
	/* pathprof-510.bpf.o (no xchg): a message marked ready on another CPU between the load and the store is lost
	 * (its consume then finds none, counted as unpaired) */
	__u64 r = pp_xchg(&s->ready_ts, 0), now = bpf_ktime_get_ns();
	int later = 0;                    /* a hop's later part of a reply: its chain kept (relay.bpf.h) */
	if (r && r < ws) {
		stat_inc(PP_STAT_WINDOW_EDGE);  /* became ready before the window: its wait is not whole */
		r = 0;
	}
	if (!(r && now >= r))
		r = 0;
	if (!r && is_hop_role(t->role) && !off_path)   /* read on from what was queued: still a part of the reply */
		later = relay_consume(s, t, 0, 0, 0, now, ws);
	if (r) {
		__u64 w = t->wake_ts, on = t->oncpu_ts >= w ? t->oncpu_ts : w;
		if (!(w > r && w <= now))
			w = on = 0;               /* already awake: the message was queued behind other work */
		if (is_hop_role(t->role)) {
			later = !off_path && relay_consume(s, t, r, w, on, now, ws);
			if (!off_path && !later)
				piece_spans(s, r, w, on, now, t->wake_idle, s->seq, 0);
		} else {                      /* kept until the receiver answers: only the last piece counts */
			if (s->pend_done)
				stat_inc(PP_STAT_PIECE_SUPERSEDED);
			s->pend_ready = r;
			s->pend_wake = w;
			s->pend_oncpu = on;
			s->pend_done = now;
			s->pend_seq = s->seq;
			s->pend_idle = t->wake_idle;
			s->pend_busy = 0;
			if (s->owner) {           /* the thread's connect time since the reply became ready */
				__u64 b = conn_busy_at(s->owner, now);
				s->pend_busy = b > s->ready_busy ? b - s->ready_busy : 0;
			}
		}
	}
	if (is_hop_role(t->role)) {
		if (s->leg == PP_LEG_REQUEST && !off_path) {
			/* a client's request: held until a forward upstream takes it (at once when a server connection
			 * is free, later when the hop is a pooler out of them); see holdq.bpf.h */
			hold_push(cur_task_ptr(), s, now, s->seq, tcp ? moved : (__u32)bytes);
			return;
		}
		hold_activity(cur_task_ptr(), now);
		if (s->leg == PP_LEG_RESPONSE && !off_path)
			hold_response(s, t);  /* where the request it answers began its forwarding */
		t->consume_ts = now;
		t->consume_leg = s->leg;
		t->consume_seq = s->seq;
		t->consume_later = later ? PP_RELAY_DEFERRED : 0;
		t->consume_setup = off_path;  /* and so is forwarding it */
	} else {
		s->consume_ts = now;
	}
}

/* A receive returned: sock_recv_length (Linux >= 6.3), or fexit of the protocol's recvmsg on older kernels, which
 * the tracepoint's caller (sock_recvmsg_nosec) calls through sock->ops: the same call, the same return value. */
static __always_inline int on_recv(struct sock *sk, int ret, int flags)
{
	if (ret <= 0 || (flags & MSG_PEEK))
		return 0;
	__u64 ws = win_start();
	if (!ws)
		return 0;
	struct pp_task *t = cur_task(ws);
	if (!t || (is_hop_role(t->role) && sk->sk_protocol == IPPROTO_TCP_NUM))
		return 0;                     /* a hop's TCP consumes: pp_tcp_consume */
	on_consume(sk, t, ws, 0, ret);
	return 0;
}

SEC("tp_btf/sock_recv_length")
int BPF_PROG(pp_sock_recv, struct sock *sk, int ret, int flags)
{
	return on_recv(sk, ret, flags);
}

SEC("fexit/inet_recvmsg")
int BPF_PROG(pp_sock_recv__fexit_inet, struct socket *sock, struct msghdr *msg, size_t size, int flags, int ret)
{
	return on_recv(sock->sk, ret, flags);
}

SEC("fexit/unix_stream_recvmsg")
int BPF_PROG(pp_sock_recv__fexit_unix, struct socket *sock, struct msghdr *msg, size_t size, int flags, int ret)
{
	return on_recv(sock->sk, ret, flags);
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
		on_consume(sk, t, ws, 1, 0);
	return 0;
}

/* The end of a send: the processing before it (consume -> send start), the reply's wait it answers, a hop's
 * forwarding. At its start for a client's or server's TCP send (pp_tcp_send, send_at_start), else at its end. */
static __always_inline int send_over(struct sock *sk, struct pp_task *t, __u64 ws, int ret, int was_sending)
{
	if (ret <= 0)
		return 0;
	if (conn_split && !was_sending) {
		/* a send whose start was not seen (AF_UNIX into a socket not known yet: a client's startup packet, a
		 * backend's hello into it): know the socket from here on, and let a backend leave its setup */
		if (!is_hop_role(t->role) && !learn_sock(sk, t) && t->role == PP_ROLE_PGBENCH)
			conn_busy_mark((__u32)bpf_get_current_pid_tgid(), bpf_ktime_get_ns(), 2);   /* a new connection */
		if (t->conn_setup && ret > 1)
			t->conn_setup = 0;
		return 0;
	}
	if (!was_sending) {               /* its start unseen: still an answer, after which a piece starts anew */
		t->setup_peer = 0;
		struct pp_sock *a = sock_get(&socks, sk);
		if (a)
			a->piece_ts = 0;
		return 0;
	}
	struct pp_sock *s = learn_sock(sk, t);
	if (s)
		s->last_send = t->send_ts;
	else if (own_conn(sk)) {          /* an answer on pathprof's own connection: not the path's work, but */
		if (is_hop_role(t->role)) /* work a held request waited behind (poolwait) */
			hold_activity(cur_task_ptr(), bpf_ktime_get_ns());
		return 0;
	}    /* a retransmission of this message goes back to here (tcp_loss.bpf.h) */
	if (conn_split && !s && t->role == PP_ROLE_PGBENCH)
		conn_busy_mark((__u32)bpf_get_current_pid_tgid(), bpf_ktime_get_ns(), 2);      /* a new connection */
	__u64 start = 0;
	__u32 seq = 0;
	__u8 leg = 0;
	if (is_hop_role(t->role)) {
		struct task_struct *task = cur_task_ptr();
		struct pp_hold *e = 0;
		__u64 act = 0;
		if (s && s->leg == PP_LEG_RESPONSE)
			s->reply_ts = 0;          /* a send upstream: what comes back next is a new reply */
		if (t->own_msg == PP_OWN_HELD && s && s->leg == PP_LEG_RESPONSE) {
			/* the hop's own query while a request waits for it: the request stays held, and its wait
			 * (poolwait.<hop>) runs on through this round trip, whose stages are the setup's */
			t->own_msg = 0;
			hold_activity(task, bpf_ktime_get_ns());
			stat_inc(PP_STAT_SETUP_SPANS);
			return 0;
		}
		if (s && s->leg == PP_LEG_RESPONSE)
			e = hold_pop(task, ws, &act);  /* a forward upstream: the oldest request held */
		else if (s)
			hold_answered(s, t, ws);       /* to a client: its request's wait, if it was held */
		/* a held request's forwarding starts when this send is over (not at its start: the send is this
		 * message's, and another transaction's chain must not share its start) */
		hold_activity(task, bpf_ktime_get_ns());
		if (e) {                      /* held while the hop did other work up to act: no server connection */
			if (act > t->send_ts)
				act = t->send_ts;
			stat_inc(PP_STAT_HOLDS);
			start = act;
			leg = PP_LEG_REQUEST;
			seq = e->seq;
			t->consume_ts = 0;
			t->consume_leg = PP_LEG_REQUEST;   /* a continued send (more pieces upstream) is this request's */
			t->consume_seq = seq;
		} else {                      /* forwards this thread's last unforwarded consume */
			start = t->consume_ts;
			leg = t->consume_leg;
			seq = t->consume_seq;
			t->consume_ts = 0;
			if (t->consume_setup) {   /* forwarding a setup message: the connection probe's time */
				t->consume_setup = 0;
				t->consume_leg = 0;   /* and a send that continues from it (no read, no sleep) is too */
				stat_inc(PP_STAT_SETUP_SPANS);
				return 0;
			}
			if (t->consume_later == PP_RELAY_DEFERRED && s && s->leg != PP_LEG_RESPONSE) {
				stat_inc(PP_STAT_RELAY_SENT);
				return 0;         /* a later part's forward: in its receiver's chain (relay.bpf.h) */
			}
		}
		/* --connect: every connection has new proxy goroutines, which move between threads: a consume followed
		 * by a sleep of this thread was forwarded by another one, and must not pair with this later send */
		if (conn_split && start && t->wake_ts > start)
			start = 0;
		/* a request forwarded upstream: its wait in the hop ends where this forward's work began (charged when
		 * the client is answered, holdq.bpf.h); a forward with no start seen ends it at the send */
		if (s && s->leg == PP_LEG_RESPONSE)
			hold_forwarded(s, start && start < t->send_ts ? start : t->send_ts);
	} else if (s && (s->setup_msg & PP_SETUP_HELLO)) {   /* pgbench's first query: its connection phase */
		s->piece_ts = 0;
		s->setup_msg &= ~PP_SETUP_HELLO;
		s->pend_done = 0;
		s->consume_ts = 0;
		stat_inc(PP_STAT_SETUP_SPANS);
		return 0;
	} else if (s) {                   /* request/response on the same connection (backend, pgbench) */
		s->piece_ts = 0;              /* answered: the next piece into s starts a new message */
		/* --connect: a backend answering inside its setup (the SSL refusal, its hello), or a client answering a
		 * setup message other than the hello: the connection probe's time, wait and processing alike */
		__u8 m = s->setup_msg;
		int setup_send = t->conn_setup || t->setup_peer || ((m & PP_SETUP_PEND) && !(m & PP_SETUP_LAST));
		t->setup_peer = 0;
		s->setup_msg = m & (PP_SETUP_READY | PP_SETUP_SEEN);   /* SEEN: no more loads to look for a setup */
		if (t->conn_setup && ret > 1) {
			t->conn_setup = 0;        /* the hello (ReadyForQuery): from here on, transactions */
			s->setup = 0;
		}
		if (m & PP_SETUP_PEND) {
			s->pend_done = 0;
			stat_inc(PP_STAT_SETUP_SPANS);
		}
		if (setup_send) {
			s->consume_ts = 0;
			stat_inc(PP_STAT_SETUP_SPANS);
			return 0;
		}
		if (s->pend_done) {           /* the reply it answers: its last piece's wait */
			if (s->pend_ready >= ws)
				piece_spans(s, s->pend_ready, s->pend_wake, s->pend_oncpu, s->pend_done, s->pend_idle,
					    s->pend_seq, s->pend_busy);
			s->pend_done = 0;
		}
		start = pp_xchg(&s->consume_ts, 0);   /* 510 object: load then store, the sending thread's own socket */
		seq = s->seq;
		leg = t->role == PP_ROLE_PGBENCH ? PP_LEG_CLIENT : PP_LEG_SERVER;
		if (start && leg == PP_LEG_CLIENT)
			client_cycle(s, t->send_ts, ws);
		if (start)
			t->answer_ts = t->send_ts;   /* its measured work ends here; a relayed reply's chain after (relay.bpf.h) */
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

/* A send returned: sock_send_length (Linux >= 6.3), or fexit of the protocol's sendmsg (see on_recv) */
static __always_inline int on_send_end(struct sock *sk, int ret)
{
	__u64 ws = win_start();
	if (!ws)
		return 0;
	struct pp_task *t = cur_task(ws);
	if (!t)
		return 0;
	int was_sending = t->in_send;
	t->in_send = 0;                   /* the send is over, whatever its outcome */
	t->send_sk = 0;                   /* and so is a send closed at its start: a later lock on a socket at the
					   * same address (closed, its memory reused) is not this send (sending()) */
	/* --connect: pgbench's Terminate ('X' + length: 5 bytes). Its trip is its wire stage (send start -> delivered
	 * inside this send); nobody answers it, so the rest of the send (the softirq finishing, a receiver it woke on
	 * this CPU running first) is pgbench's own, up to where connect.thread_wait starts: this send's end */
	if (conn_split && ret == 5 && t->role == PP_ROLE_PGBENCH) {
		/* the delivery: TCP's in this send (cont_ts after its start), AF_UNIX's is where its send was taken
		 * to start (the receiver's sk_data_ready) */
		__u64 at = 0;
		if (sk->sk_protocol == IPPROTO_TCP_NUM && t->cont_ts > t->send_ts)
			at = t->cont_ts;
		else if (sk->__sk_common.skc_family == AF_UNIX_NUM && was_sending)
			at = t->send_ts;
		__u64 now = bpf_ktime_get_ns();
		if (at >= ws && now > at)
			span(PP_ST_PROC, t->role, PP_LEG_CLIENT, t->hop, at, now - at, t->send_seq);
	}
	if (send_at_start && !is_hop_role(t->role) && sk->sk_protocol == IPPROTO_TCP_NUM)
		return 0;                     /* closed at its start (pp_tcp_send) */
	return send_over(sk, t, ws, ret, was_sending);
}

SEC("tp_btf/sock_send_length")
int BPF_PROG(pp_sock_send, struct sock *sk, int ret, int flags)
{
	return on_send_end(sk, ret);
}

SEC("fexit/inet_sendmsg")
int BPF_PROG(pp_sock_send__fexit_inet, struct socket *sock, struct msghdr *msg, size_t size, int ret)
{
	return on_send_end(sock->sk, ret);
}

SEC("fexit/unix_stream_sendmsg")
int BPF_PROG(pp_sock_send__fexit_unix, struct socket *sock, struct msghdr *msg, size_t size, int ret)
{
	return on_send_end(sock->sk, ret);
}

#endif /* PATHPROF_MSG_BPF_H */
