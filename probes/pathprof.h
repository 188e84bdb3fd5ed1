/* Layout of pathprof.bpf.c's per-thread, per-socket and in-flight state (mirrored in
 * pathprof.agent.probing.bpf.layout). Types only. */
#ifndef PATHPROF_H
#define PATHPROF_H
#include "common.h"

struct pp_task {            /* task-local storage of a tracked thread: its presence is what "tracked" means */
	__u64 send_ts;          /* start of the send in progress (TCP: first tcp_sendmsg_locked) */
	__u64 wake_ts;          /* last sched_wakeup */
	__u64 oncpu_ts;         /* last switch-in (0 while off CPU) */
	__u64 runnable_ts;      /* start of the current run-queue wait (wakeup or preemption); xchg'd at switch-in */
	__u64 excl_snap;        /* cpust.excl_total at switch-in */
	__u64 consume_ts;       /* hops: this thread's last consume not yet forwarded */
	__u64 last_utime;       /* task->utime/stime at the last switch-out */
	__u64 last_stime;
	__u64 usdt_ts[PP_NUSDT];
	__u64 io_mark;          /* deep: last boundary of the backend's exclusive waits/I-O (see usdt_mark) */
	__u64 win;              /* window the timestamps above belong to (see fresh_task) */
	__u32 hop;              /* hop id, < PP_MAX_HOPS */
	__u32 consume_seq;      /* message number of that consume (hops' traces) */
	__u8  role;
	__u8  consume_leg;
	__u8  in_send;          /* between the start of a send and its sock_send_length */
	__u8  wake_idle;        /* the last wakeup put it on a CPU that was idle (running its idle task) */
	__u32 send_seq;         /* --trace-sample: the transaction number the send in progress carries */
	__u64 cont_ts;          /* hops: when its last send was delivered (sk_data_ready in its send) */
	__u8  conn_setup;       /* backend (--connect): its connection's setup exchange is not over yet */
	__u8  consume_setup;    /* hops (--connect): the consume not yet forwarded is a setup message */
	__u8  own_msg;          /* hops (--connect): the send upstream under way is the hop's own (a reset, a SET):
				 * PP_OWN_IDLE with no request held, PP_OWN_HELD while one waits for it (msg.bpf.h) */
	__u8  setup_reply;      /* backend (--connect): the send under way answers a setup or a pooler's own message */
	__u8  consume_later;    /* hops: that consume was a later part of a reply already partly forwarded: its stages
				 * are accounted at the reply's last receiver (stall.bpf.h, relay_*), not here */
	__u8  ch_idle;          /* ... its wakeup put it on an idle CPU */
	__u8  ch_up_role;       /* ... the role of its upstream sender (a backend) */
	__u8  setup_peer;       /* backend, no --connect: the send under way is its setup answer to pgbench itself
				 * (msg.bpf.h setup_of_pgbench) */
	__u64 ch_up_send, ch_ready, ch_wake, ch_oncpu;   /* ... its chain: the upstream send that delivered it, ready,
							  * woken, on CPU (the consume is consume_ts or the send's) */
	__u64 ch_consume;
	__u64 ch_up_from;       /* ... where its upstream sender's answer began (its own stages end there) */
	__u32 ch_up_hop;
	__u32 ch_pad;
	__u64 answer_ts;        /* a backend, pgbench: the first send of its answer to the message it last read */
	__u64 fwd_act;          /* hops: where the forwarding upstream of the request whose response it consumed began
				 * (from that connection's pp_sock.fwd_act), until it answers the client: holdq.bpf.h */
	__u64 send_sk;          /* the socket of the send begun at send_ts (send_at_start: is it still under way?) */
	__u64 thr_from;         /* off CPU since then with its cgroup throttled (CPU quota used up), 0 = not */
	__u64 thr0_s, thr0_e;   /* its last two throttled intervals, newest first (sched.bpf.h) */
	__u64 thr1_s, thr1_e;
	__u64 thro_s, thro_e, thro_ns;  /* the older ones since it last slept, summed (common.h pp_cpu_state) */
	__u64 thr_rq, thr_base; /* its run-queue wait's cfs_rq and that one's throttled time then (sched.bpf.h) */
};

struct pp_sock {            /* socket-local storage of a socket a tracked thread sent or received on */
	__u64 ready_ts;         /* first sk_data_ready since the queue was last drained, 0 = nothing pending */
	__u64 consume_ts;       /* last consuming receive, until the next send on this socket */
	__u32 hop;
	__u8  role;             /* owner's role */
	__u8  leg;              /* leg of messages *into* this socket */
	__u8  setup;            /* --connect, a backend's socket: its startup exchange is not over */
	__u8  setup_msg;        /* PP_SETUP_* bits (msg.bpf.h), which messages belong to the connection setup */
	__u32 seq;              /* --trace-sample: the transaction number of the message into this socket (msg.bpf.h) */
	__u32 copied;           /* TCP copied_seq at the last consume: tcp_rcv_space_adjust without new data is none */
	/* request/response receivers (pgbench, backend): the last consumed piece of the message, emitted when the
	 * receiver next sends. A reply that arrives in pieces (a pooler forwarding a response in parts) is waited
	 * for by the last piece only: the earlier pieces' wakeups overlap the upstream work on the rest. */
	__u64 pend_ready, pend_wake, pend_oncpu, pend_done;   /* pend_done = 0: nothing pending */
	__u32 pend_seq;
	__u8  pend_idle;
	__u8  pend_pad[3];
	/* --connect, pgbench's sockets: the owning thread, and how long it had spent opening connections when the reply
	 * became ready; at the consume, how much of the wait that was (PP_ST_CONNWAIT) */
	__u32 owner;
	__u32 owner_pad;
	__u64 ready_busy;
	__u64 pend_busy;
	__u32 hold_id;          /* a hop's client socket: its slot in `holdts` (0 = none yet) */
	__u32 hold_seq;         /* ... and the trace number of its request held there */
	__u64 last_send;        /* start of the last message sent on this socket (a retransmission's message) */
	__u64 fwd_act;          /* a hop's server connection: where the hop began forwarding the request it carries
				 * (its first forward since the last response was taken), 0 = none: holdq.bpf.h */
	__u32 sent_seq;         /* --trace-sample, a socket requests are sent on: the number of the last one, which
				 * its answer takes when the answer's sender is on another host */
	__u32 sent_pad;
	/* a request/response receiver's socket: the message it has not answered yet, in pieces (stall.bpf.h) */
	__u64 piece_ts;         /* the last piece's arrival, 0 = none since the receiver's last send */
	__u32 peer_hop;         /* the sender's hop and role, learned from a piece its send delivered */
	__u8  peer_role;
	__u8  piece_full;       /* the last piece left the receiver's window full */
	__u8  piece_relayed;    /* the last piece came from a hop's send of a later part of the reply (stall.bpf.h) */
	__u8  piece_pad;
	/* a hop's server connection: the reply it is reading (stall.bpf.h, relay_*) */
	__u64 reply_ts;         /* the hop's first consume of it, 0 = none since the hop last sent on it */
	__u64 up_send;          /* the sender's send start that delivered the part pending now (0 = not seen) */
	__u64 up_from;          /* ... the first send of the sender's answer (pp_task.answer_ts), last seen */
	/* a client's socket: the window its requests were last seen in, and the last request's send (msg.bpf.h
	 * client_cycle: each client connection's time from its first request to its last, for attach's cycle) */
	__u64 cycle_ws;
	__u64 cycle_last;
};

/* A retransmitted message, from the sender's tcp_retransmit_skb to the receiver's sk_data_ready (`retx`, a
 * direct-mapped array: no insert/delete per packet). Keyed by a TCP sequence number, which both ends see alike
 * even when NAT (DNAT, MASQUERADE) rewrites the addresses and ports between them: the receiver's rcv_nxt once
 * the retransmission is delivered, which the sender knows as its snd_nxt (everything sent so far) or the
 * retransmitted segment's end_seq (a hole that no later segment waits behind); two slots when they differ. */
#define PP_RETX_SLOTS 1024  /* power of two */
/* one more slot past them (never a hash's): its retx_ts is the last retransmission parked, so a delivery looks for
 * one first only once one was parked in its window; a healthy window pays that slot's lookup per TCP delivery */
#define PP_RETX_LAST PP_RETX_SLOTS
struct pp_retx {
	__u32 seq;              /* the receiver's rcv_nxt that delivers it */
	__u32 other;            /* the message's other key (== seq when there is one), cleared with it */
	__u8  kind;             /* PP_ST_RETX_RTO / _FAST / _PROBE of the last retransmission */
	__u8  pad[7];
	__u64 send_ts;          /* the message's original send start (0 = slot free) */
	__u64 retx_ts;          /* its last retransmission */
};

/* A hop thread's requests consumed and not yet forwarded, oldest first (task storage `holdq`, hop threads
 * only). A pooler with no free server connection reads a client's request and holds it; it forwards waiting
 * requests in arrival order when a server connection frees, so each forward upstream pops the oldest. An entry
 * is valid while `holdts[id]` still holds its stamp: a newer request on the same client socket, or the hop
 * answering that client itself (an admin console, an error), clears it and the entry is skipped. */
#define PP_HOLDQ 128        /* power of two; more held requests than this drop the oldest (counted) */
#define PP_HOLD_SLOTS 4096  /* `holdts` entries; power of two */
struct pp_hold {
	__u64 ts;               /* consumed */
	__u32 seq;              /* its trace number */
	__u32 id;               /* the client socket's hold id (pp_sock.hold_id) */
	__u32 len;              /* bytes read of it (--connect: a send upstream of another size is not its forward) */
	__u32 pad;
};
struct pp_holdq {
	__u32 head, tail;       /* head: next to pop; tail: next free; tail - head entries */
	__u64 last_act;         /* the thread's last consume or send start: where a held request's forwarding begins */
	struct pp_hold e[PP_HOLDQ];
};

struct pp_connbusy {        /* `connbusy` hash, key: a pgbench thread id (--connect) */
	__u64 busy;             /* ns spent opening connections, completed ones */
	__u64 start;            /* start of the one being opened, 0 = none */
};

/* A data skb in flight on a device: a direct-mapped slot of the `devq` array, chosen by the skb's address
 * (no hash insert/delete per packet). The receive pairs only when skb and skb->head both match: a freed and
 * reused skb carries another data buffer. Replaced and stale stamps are counted. */
struct pp_devq {
	__u64 skb;              /* 0 = free */
	__u64 head;
	__u64 ts;               /* net_dev_start_xmit */
	__u64 send_ts;          /* the tracked sender's send start when it ran the xmit (tap: wire into qemu) */
	__u32 ifindex, netns;
	__u8  leg, pad[7];
};
#define PP_DEVQ_SLOTS 4096  /* power of two */

/* Per-CPU netfilter bracket slots: the INT_MIN+1 program parks {skb, ts} in slot[hook] and the INT_MAX-1
 * program picks it up. A softirq can interrupt a process-context traversal of the same hook (a TCP ACK sent
 * from softirq during OUTPUT), so each hook has a second, nested slot; a third traversal (or a preempted
 * one) is counted (nf_nested_full), never paired wrongly. */
#define PP_NF_SLOTS 10

struct pp_nf_slot {
	__u64 skb;
	__u64 ts;
	__u32 saddr, daddr;     /* tuple at the first bracket: a change at the second one = NAT */
	__u16 sport, dport;
	__u8  leg;
	__u8  data;             /* carries payload */
	__u8  pad[2];
	__u64 state;            /* the traversal's nf_hook_state: another one at nf_end = reinjected from a queue */
};
#endif
