/* Layout of pathprof.bpf.c's per-thread and per-socket state (mirrored in pathprof.agent.bpf.layout). */
#ifndef PATHPROF_H
#define PATHPROF_H
#include "common.h"

struct pp_task {            /* one per tracked thread (key: tid) */
	__u64 send_ts;          /* start of the send in progress (TCP: first tcp_sendmsg_locked) */
	__u64 wake_ts;          /* last sched_wakeup */
	__u64 oncpu_ts;         /* last switch-in (0 while off CPU) */
	__u64 runnable_ts;      /* start of the current run-queue wait (wakeup or preemption) */
	__u64 excl_snap;        /* cpust.excl_total at switch-in */
	__u64 consume_ts;       /* hops: this thread's last consume not yet forwarded (qemu: on the tgid entry) */
	__u64 last_utime;       /* task->utime/stime at the last switch-out */
	__u64 last_stime;
	struct pp_cpu_val acc;  /* monotonic; folded into `cpu` when the thread exits */
	__u64 usdt_ts[PP_NUSDT];
	__u64 win;              /* window the timestamps above belong to (see fresh_task) */
	__u32 hop;              /* hop id, < PP_MAX_HOPS */
	__u32 consume_seq;      /* message number of that consume (hops' traces) */
	__u8  role;
	__u8  consume_leg;
	__u8  in_send;          /* between the start of a send and its sock_send_length */
	__u8  pad[5];
};

struct pp_sock {            /* one per socket a tracked thread sent or received on (key: struct sock *) */
	__u64 ready_ts;         /* first sk_data_ready since the queue was last drained, 0 = nothing pending */
	__u64 consume_ts;       /* last consuming receive, until the next send on this socket */
	__u64 cookie;           /* socket cookie: a freed and reused struct sock address is a new socket */
	__u32 hop;
	__u8  role;             /* owner's role */
	__u8  leg;              /* leg of messages *into* this socket */
	__u8  pad[2];
	__u32 seq;              /* messages into this socket (seen in windows): --trace-sample picks by it */
	__u32 copied;           /* TCP copied_seq at the last consume: tcp_rcv_space_adjust without new data is none */
};

struct pp_devq {            /* a data skb in flight on a device (key: skb address) */
	__u64 ts;               /* net_dev_start_xmit */
	__u32 ifindex, netns;
	__u8  leg, pad[7];
	__u64 send_ts;          /* the tracked sender's send start when it ran the xmit (tap: wire into qemu) */
};
#endif
