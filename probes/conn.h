/* Layout of conn.bpf.c (connection setup under pgbench -C), mirrored in pathprof.agent.probing.conn.
 * Step ids index the `conn_agg` per-CPU array of pp_hist (common.h); the names live in the front end. */
#ifndef PATHPROF_CONN_H
#define PATHPROF_CONN_H
#include "common.h"

enum pc_step {
	/* latency, one sample per matched connection, in timeline order */
	PC_ST_HANDSHAKE = 1,    /* client SYN_SENT -> client ESTABLISHED (TCP only) */
	PC_ST_ACCEPT = 2,       /* ESTABLISHED (TCP) / connect() call (unix) -> postmaster's accept() returns */
	PC_ST_FORK = 3,         /* accept() returned -> fork done (sched_process_fork of the postmaster) */
	PC_ST_FIRST_RUN = 4,    /* fork -> the child's first switch-in */
	PC_ST_INIT_AUTH = 5,    /* first run -> ReadyForQuery queued on the client's socket */
	PC_ST_DELIVERY = 6,     /* ReadyForQuery queued -> the client's recv returned it */
	PC_ST_FIRST_QUERY = 7,  /* backend received its first query -> sent the result (inside pgbench's latency) */
	PC_ST_TEARDOWN = 8,     /* backend's last receive (Terminate/EOF) -> the dead backend leaves the CPU */
	PC_ST_REAP = 9,         /* backend gone -> postmaster's waitpid() returns it (0 when reaped first) */
	PC_ST_TOTAL = 10,       /* connect start -> client received ReadyForQuery (the sum of 1..6) */
	PC_ST_THREAD_WAIT = 11, /* a client closed its connection (Terminate sent) -> its thread starts its next connect:
	                         * PQfinish's close(), then waiting while the thread serves its other clients (their
	                         * blocking connects, their results). Sum only: the integral over the window of the
	                         * thread's clients in that state (no client identity needed), per connection. Also a
	                         * client's wait before its first connect, while the thread connected its other clients
	                         * first (seconds when one of those waits for a SYN retransmission) */
	PC_ST_CLIENT_TOTAL = 12, /* client's connect start -> its first read of more than 1 byte (the hello), measured on
	                          * the client alone: what a backend that cannot be paired with it (a hop or NAT in
	                          * between) leaves unsplit */
	PC_ST_SYN_RETX = 13,    /* client SYN_SENT -> the handshake's last retransmission before ESTABLISHED (the
	                         * client's SYN or the server's SYN-ACK again). Sum only, one per connection that had
	                         * one; emitted by the client alone (no pairing needed). conn_syn.bpf.h */
	PC_ST_SYNACK_RETX = 14, /* client ESTABLISHED -> the last retransmission before the server took the connection
	                         * (its SYN-ACK again, or the client's first data): the final ACK was dropped (a full
	                         * accept queue). Sum only; paired connections. conn_syn.bpf.h */
	PC_ST_HOP_ACCEPT = 15,  /* a hop's end of the connection ESTABLISHED -> the hop's first read on it: the hop's accept
	                         * queue (pgpool-II with every child busy: the wait for a free child) and its accept */
	/* CPU, on-CPU ns per matched connection */
	PC_ST_CPU_CLIENT = 16,  /* client thread, connect start -> ReadyForQuery received */
	PC_ST_CPU_INIT = 17,    /* backend, first run -> ready (backend start + auth) */
	PC_ST_CPU_QUERY = 18,   /* backend, first query */
	PC_ST_CPU_EXIT = 19,    /* backend, last receive -> gone */
	PC_ST_CPU_BACKEND = 20, /* backend, whole life */
	PC_ST_CPU_PM = 21,      /* postmaster, all of it (sum only; count = on-CPU stints) */
	PC_NSTEPS = 24,
};

enum pc_stat {              /* per-CPU counters: nothing unmatched or lost goes unseen */
	PC_STAT_STARTS = 0,         /* client connection starts seen (SYN_SENT / unix connect()) */
	PC_STAT_ACCEPTS = 1,        /* postmaster accept() returns */
	PC_STAT_FORKS = 2,          /* postmaster forks that follow an accept (connection backends) */
	PC_STAT_READY = 3,          /* backends that sent their first message */
	PC_STAT_MATCHED = 4,        /* ... and were paired with a tracked client's connection start */
	PC_STAT_UNMATCHED = 5,      /* ready backends with no client start (untracked client or lost start) */
	PC_STAT_TASKS_FULL = 6,
	PC_STAT_PENDING_FULL = 7,
	PC_STAT_ORDER = 8,          /* an interval came out negative (clamped to 0) */
	PC_STAT_GONE_UNREADY = 9,   /* backend exited before it was ready (failed/cancelled connection) */
	PC_STAT_REAPED = 10,
	PC_STAT_ACCEPT_LOST = 11,   /* an accept() not followed by a fork before the next accept */
	PC_STAT_NO_PEER = 12,       /* ready send without a peer socket seen nor its client's ISN (a hop in between) */
	PC_STAT_NEGOTIATION = 13,   /* 1-byte SSL/GSS refusals sent before the startup packet (skipped) */
	PC_STAT_SAMPLED = 14,       /* connections that started and became ready inside a measurement window */
	PC_STAT_SYN_RETRANS = 15,   /* a client's SYN retransmitted (SYN dropped: the listen queue overflowed) */
	PC_STAT_SYNACK_RETRANS = 16, /* the server's SYN-ACK retransmitted (the client's ACK dropped: accept queue full) */
	PC_STAT_UNPAIRED_SAMPLED = 17, /* backends ready inside a window with no client paired (hop or NAT in between) */
	PC_STAT_STALE = 18,          /* client connection starts never paired, dropped at the client's next start */
	PC_STAT_SYN_RETRANS_SAMPLED = 19, /* ... of them, SYNs of connections sampled (started inside a window) */
	PC_STAT_HS_RETX_SAMPLED = 20,     /* sampled connections whose handshake waited for a retransmission */
	PC_STAT_SYNACK_RETX_SAMPLED = 21, /* sampled, paired connections the server took only after a retransmission */
	PC_STAT_ISN_PAIRED = 22,          /* backends paired with their client by the server's initial sequence number
	                                   * (the hello woke no client socket inside the send: a delay line, NAT) */
	PC_STAT_CLIENTS_SAMPLED = 23,     /* clients that read their hello on a connection started inside a window */
	PC_NSTATS = 24,
};

enum pc_role { PC_ROLE_CLIENT = 1, PC_ROLE_BACKEND = 2 };

/* PC_NB is a power of two so that `bucket & (PC_NB - 1)` is a bound the verifier keeps (5..7 unused) */
enum pc_cpu_bucket { PC_B_INIT = 0, PC_B_IDLE = 1, PC_B_QUERY = 2, PC_B_SESSION = 3, PC_B_TAIL = 4, PC_NB = 8 };

struct pc_task {            /* `who` hash, key tid: a tracked client thread or a connection backend */
	__u64 on_ts;            /* last switch-in, 0 while off CPU */
	__u64 cpu[PC_NB];       /* on-CPU ns per bucket (clients use PC_B_INIT while connecting) */
	__u64 start_ts;         /* client: connect start of the connection in flight */
	__u64 ready_ts;         /* client: ReadyForQuery queued, waiting for its recv; backend: ready */
	__u64 recv_ts;          /* client: last recv with data; backend: last receive */
	__u64 accept_ts, fork_ts, first_run_ts, qrecv_ts, gone_ts;
	__u64 dr_ts;            /* backend: sk_data_ready on the peer inside the send in progress */
	__u64 dr_sk;            /* ... and the peer socket */
	__u32 fin;              /* backend: gone + reaped, whichever is second finishes the record */
	__u8  role;
	__u8  bucket;           /* current CPU bucket */
	__u8  matched;          /* backend: paired with a tracked client's start */
	__u8  unix_pending;     /* client: unix connect() called, startup packet not sent yet */
	__u32 ports;            /* backend on TCP: client port << 16 | server port, from its first receive */
	__u8  sampled;          /* its connection started inside a window (client: the one in flight) */
	__u8  hello;            /* client: the connection in flight has read its hello */
	__u8  fork_win;         /* backend: forked inside a window (its steps count even unpaired) */
	__u8  closed_once;      /* client thread: one of its clients has closed (its first connects are over) */
	__u64 close_ts;         /* client thread: when closed_n last changed */
	__u32 closed_n;         /* client thread: its clients between their Terminate and their next connect */
	__u32 starts_n;         /* client thread: its connects so far (saturating) */
	__u64 pend_key;         /* client thread: `pending` key of its last connection (dropped at the next start) */
	__u64 first_ts;         /* client thread: its first connect's start (its clients all wait from there) */
};

struct pc_pending {         /* `pending` LRU hash, key: the client's struct sock * */
	__u64 start_ts;
	__u64 est_ts;           /* TCP: client ESTABLISHED, 0 for unix */
	__u32 tid;              /* client thread */
	__u32 sampled;          /* started inside a window: sampled however long it takes (a SYN retransmitted) */
	__u64 retx_ts;          /* TCP: the connection's last retransmission in its current phase (SYN_SENT, then
	                         * ESTABLISHED until paired) */
	__u64 hs_from;          /* TCP: where connect.tcp_handshake starts (the last handshake retransmission, or
	                         * the start) */
	__u32 srv_isn;          /* TCP: the server's initial sequence number (its SYN-ACK's), for SYN-ACK retransmits */
	__u32 pad;
};
#endif
