/* Consuming receives, and the hops' own programs. Included once, by pathprof.bpf.c, after
 * pathprof_helpers.h. The stage model is documented in pathprof.analysis.views.
 *
 * A hop process (pgbouncer, a pgpool child, docker-proxy, qemu) consumes a message on one socket and forwards
 * it on another, so its processing ("consumed -> forwarded") pairs a send with the consume *of the message
 * being forwarded*: the most recent consume by the same thread that no send has claimed yet (t->consume_ts).
 * An event loop (pgbouncer) reads one connection and forwards what it read before it reads the next; Go's
 * docker-proxy copies each direction in one goroutine (splice in, splice out, back to back on one thread).
 * Pairing by socket instead (the previous send's consume on the same socket) measured a whole half-cycle.
 *
 * On TCP a hop's consume is taken at tcp:tcp_rcv_space_adjust, which both tcp_recvmsg and tcp_read_sock
 * (splice(2): Go's io.Copy between two TCPConns, i.e. docker-proxy) run after moving data, where
 * sock:sock_recv_length only fires for recvmsg. A call that moved nothing (a splice that found the queue empty,
 * a peek) leaves copied_seq as it was and is not a consume. */
#ifndef PATHPROF_HOPS_H
#define PATHPROF_HOPS_H

/* t consumed the message pending on sk: close its ready -> consumed stages (wakeup, runqueue, recv, or
 * queued) and remember the consume for the processing that follows (on the socket for request/response
 * roles, on the thread for hops) */
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
	__u64 now = bpf_ktime_get_ns(), r = s->ready_ts;
	if (r && r < ws) {
		stat_inc(PP_STAT_WINDOW_EDGE);  /* became ready before the window: its wait is not whole */
		r = 0;
		s->ready_ts = 0;
	}
	if (r) {
		if (t->wake_ts > r) {
			span(PP_ST_WAKEUP, s->role, s->leg, s->hop, r, t->wake_ts - r, s->seq);
			__u64 on = t->oncpu_ts >= t->wake_ts ? t->oncpu_ts : t->wake_ts;
			span(PP_ST_RUNQUEUE, s->role, s->leg, s->hop, t->wake_ts, on - t->wake_ts, s->seq);
			span(PP_ST_RECV, s->role, s->leg, s->hop, on, now - on, s->seq);
		} else {
			span(PP_ST_QUEUED, s->role, s->leg, s->hop, r, now - r, s->seq);
		}
		s->ready_ts = 0;
	}
	if (is_hop_role(t->role)) {       /* forwarded on another socket, by this thread */
		t->consume_ts = now;
		t->consume_leg = s->leg;
		t->consume_seq = s->seq;
	} else {
		s->consume_ts = now;
	}
}

SEC("tp_btf/tcp_rcv_space_adjust")   /* attached only when a hop is tracked (pathprof.agent.probes) */
int BPF_PROG(pp_tcp_consume, struct sock *sk)
{
	__u64 ws = win_start();
	if (!ws)
		return 0;
	__u32 tid;
	struct pp_task *t = cur_task(&tid, ws);
	if (t && is_hop_role(t->role))
		on_consume(sk, t, ws, 1);
	return 0;
}

/* ---------------- a qemu guest behind a tap: qemu (with the guest it runs) is the hop ----------------
 * The guest's kernel is invisible. Request: the data skb's net_dev_start_xmit on the tap (pp_dev_xmit keeps
 * the tracked sender's send start in devq) -> qemu reads it from the tap fd (tun consumes the skb in qemu's
 * context): wire.<qemu> from the send to the read, with dev.<tap> (xmit -> read: the tap's queue and qemu's
 * wakeup) inside it, as any device is inside a wire. Then hop.<qemu> on the server leg
 * (qemu + guest kernel + guest server) until qemu writes the response to the tap (its first
 * netif_receive_skb, in qemu's context), which starts the response's wire (closed at the client's
 * sk_data_ready). The guest serves several connections at once, and qemu's reads and writes of the tap may
 * be on different threads: the hop's start is kept per connection (guestq, keyed by the client's end). Both programs are attached only when a qemu hop is tracked. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);   /* client end of a connection -> qemu read its request (hop start) */
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, __u64);
} guestq SEC(".maps");

static __always_inline __u64 conn_key(__u32 addr, __u16 port) { return ((__u64)addr << 16) | port; }

SEC("tp_btf/consume_skb")
int BPF_PROG(pp_tap_read, struct sk_buff *skb, void *location)
{
	__u64 ws = win_start();
	if (!ws)
		return 0;
	__u64 key = (__u64)skb;
	struct pp_devq *q = bpf_map_lookup_elem(&devq, &key);
	if (!q)
		return 0;
	__u32 tid;
	struct pp_task *t = cur_task(&tid, ws);
	if (t && t->role == PP_ROLE_QEMU && q->ts >= ws) {
		__u64 now = bpf_ktime_get_ns();
		if (q->send_ts >= ws && q->ts > q->send_ts)   /* dev.<tap> is inside it, as devices are in wires */
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
	bpf_map_delete_elem(&devq, &key);   /* the skb is freed: its address will be reused */
	return 0;
}

SEC("tp_btf/netif_receive_skb")
int BPF_PROG(pp_tap_recv, struct sk_buff *skb)
{
	if (skb->protocol != bpf_htons(0x0800) || skb->skb_iif)
		return 0;                     /* skb_iif: not the first device receive of this skb (bridge) */
	__u64 ws = win_start();
	if (!ws)
		return 0;
	__u32 tid;
	struct pp_task *t = cur_task(&tid, ws);
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
#endif
