/* Types and constants shared by every pathprof BPF object. Python's mirrors (pathprof.agent.probing.bpf.layout)
 * are built from the BTF clang puts into pathprof.bpf.o (gen_abi.py -> abi.json at build time);
 * tests/unit/test_bpf_layout.py checks them against that BTF, offset by offset. Types only: maps and programs
 * live in the .bpf.c files, BPF-side helpers in *.bpf.h. Fixed-width types: the same bytes are read by Python. */
#ifndef PATHPROF_COMMON_H
#define PATHPROF_COMMON_H

#define PP_HIST_SLOTS 128   /* log-linear: 4 sub-buckets per power of two, 0 ns .. 2^32 ns (hist.bpf.h) */
#define PP_MAX_PORTS  16    /* service ports a run may have (the front end refuses more) */
#define PP_MAX_NETNS  16    /* topology namespaces + 1 "other" slot (the front end refuses more) */

enum pp_role {              /* who a tracked thread is; the front end names them */
	PP_ROLE_NONE = 0, PP_ROLE_PGBENCH = 1, PP_ROLE_BACKEND = 2, PP_ROLE_POSTMASTER = 3,
	PP_ROLE_PG_AUX = 4, PP_ROLE_POOLER = 5, PP_ROLE_PROXY = 6, PP_ROLE_QEMU = 7, PP_ROLE_OTHER = 8,
};

enum pp_leg { PP_LEG_NONE = 0, PP_LEG_REQUEST = 1, PP_LEG_SERVER = 2, PP_LEG_RESPONSE = 3, PP_LEG_CLIENT = 4 };

enum pp_stage {
	/* per-message stages: the `lat` per-CPU array, indexed by lat_index() in pathprof.bpf.c */
	PP_ST_WIRE = 1,        /* start of the sender's send -> sk_data_ready on the receiving socket */
	PP_ST_WAKEUP = 2,      /* sk_data_ready -> receiver's sched_wakeup, onto a CPU that was busy */
	PP_ST_RUNQUEUE = 3,    /* wakeup -> switched onto a CPU */
	PP_ST_RECV = 4,        /* on CPU -> consuming receive returned data */
	PP_ST_QUEUED = 5,      /* receiver was already awake: ready -> consumed (busy with other work) */
	PP_ST_PROC = 6,        /* consuming receive -> next send syscall entry (backend/hop/client work) */
	PP_ST_IDLE_EXIT = 7,   /* as WAKEUP, onto a CPU that was idle: the IPI and the CPU leaving idle */
	/* rarer ones: the `stages` per-CPU hash */
	PP_ST_DEV = 8,         /* net_dev_start_xmit -> netif_receive_skb of the same data skb (hop = ifindex) */
	PP_ST_BLOCK = 9,       /* a block request: issue (else allocation) -> completion (hop = dev_t, sub = op) */
	PP_ST_QDISC = 10,      /* a data skb in a root qdisc (netem): enqueue -> dequeue (hop = ifindex); qdisc.bpf.h */
	PP_ST_PG_QUERY = 12,   /* USDT (deep): query__start/done and the phases below */
	PP_ST_PG_PARSE = 13, PP_ST_PG_PLAN = 14, PP_ST_PG_EXECUTE = 15,
	PP_ST_PG_LOCK = 16, PP_ST_PG_LWLOCK = 17,
	/* the backend's I/O (deep): uprobes on XLogFlush, USDT smgr and dirty-buffer writes. (issue_xlog_fsync, the
	 * fsync itself, is exported but inlined into its caller in Debian's build: an uprobe on it never fires.) */
	PP_ST_PG_WAL_FLUSH = 18,   /* XLogFlush: a commit waiting for its WAL to be written and flushed */
	PP_ST_PG_DATA_READ = 20,   /* smgr__md__read: a data block read from the kernel (a shared_buffers miss) */
	PP_ST_PG_DIRTY_WRITE = 21, /* buffer__write__dirty: a dirty buffer written out to make room */
	PP_ST_PG_WAL_FULL = 22,    /* wal__buffer__write__dirty: WAL buffers full, written out before inserting */
	PP_ST_PG_EXCL = 19,        /* the same waits and I/O, exclusive of each other (sub = usdt index of the owner):
	                            * they add up to no more than backend.execute, whose rest is CPU and the like */
	PP_ST_POOLWAIT = 23,      /* a hop held a client's request while it did other work (a pooler with no free server
	                            * connection): consumed -> the hop's last other activity before forwarding it */
	PP_ST_RETX_RTO = 25,      /* a message's wait for the TCP retransmission that delivered it, after a timeout */
	PP_ST_RETX_FAST = 26,     /* ... a fast retransmission (duplicate ACKs / SACK: the sender was in recovery) */
	PP_ST_RETX_PROBE = 27,    /* ... a tail loss probe or another retransmission */
	PP_ST_SETUP_RETX = 29,    /* --connect: a setup message's wait for the retransmission that delivered it, inside
	                            * the connection probe's steps (sub 1: into a backend, or the 1-byte SSL refusal;
	                            * 2: the hello, or into a hop); the analysis moves it out into connect.setup_retx */
	PP_ST_RETX_COUNT = 28,    /* retransmissions of the run's sockets, by outgoing leg (sub: 1 rto 2 fast 3 probe);
	                            * counts only, not time */
	PP_ST_XSEND = 31,         /* --trace-sample, marker (ring buffer only): a TCP message's send start on this host,
	                            * with its socket's tuple and TCP sequence number (pp_trace.tcp_seq) */
	PP_ST_XRECV = 32,         /* ... its delivery (sk_data_ready) on this host: joins hosts (pathprof merge) */
	PP_ST_SEND_BLOCKED = 33,  /* a message in pieces: the receiver's window was full after a piece, so the sender
	                            * could not send until it read (stall.bpf.h; role/hop: the sender) */
	PP_ST_THROTTLED = 34,     /* the thread whose span it was waited off CPU while its cgroup's CPU quota was used up
	                            * (CFS bandwidth control): carved out of any span that overlaps it (span_cell) */
	PP_ST_CONNWAIT = 30,      /* --connect: a reply ready for pgbench while its thread was opening another client's
	                            * connection (libpq's connect blocks the thread), carved out of the reply's wait */
};
#define PP_NUSDT 11

/* lat array geometry: stage (7) x role (9) x leg (5) x hop slot (lat_hops, set at load: a run's hops + 1) */
#define PP_LAT_STAGES 7
#define PP_NROLES     9
#define PP_NLEGS      5
#define PP_MAX_HOPS   8

/* nfagg array geometry: netns slot x hook (5) x leg (2) x {all packets, data segments} */
#define PP_NF_PER_NETNS (5 * 2 * 2)

enum pp_stat {              /* per-CPU counters of everything not aggregated, so nothing is dropped silently */
	PP_STAT_TASKS_FULL = 0,     /* task storage could not be created for a forked thread */
	PP_STAT_SOCKS_FULL = 1,     /* socket storage could not be created */
	PP_STAT_STAGES_FULL = 2,
	PP_STAT_CPU_FULL = 3,       /* a thread's (role, hop) has no `cpuacc` record: its CPU time is not counted */
	PP_STAT_WIRE_UNPAIRED = 4, PP_STAT_READY_UNLEARNED = 5, PP_STAT_NF_UNPAIRED = 6, PP_STAT_NF_NESTED_FULL = 7,
	PP_STAT_NF_NAT = 8,
	PP_STAT_DEV_OVERWRITTEN = 9,   /* a device stamp replaced before its receive (dropped skb or slot collision) */
	PP_STAT_MESSAGES = 10, PP_STAT_NF_PACKETS = 11,
	PP_STAT_PROC_UNPAIRED = 12,
	PP_STAT_HOP_OVERFLOW = 13,  /* a span whose hop slot is beyond the run's (lat_hops): refused (lat_index) */
	PP_STAT_WIRE_UNTIMED = 14,
	PP_STAT_WINDOW_EDGE = 15,   /* pairings begun before the current window opened: discarded */
	PP_STAT_TRACE_LOST = 16, PP_STAT_TRACES = 17,   /* --trace-sample spans not / emitted (ring buffer full) */
	PP_STAT_DEV_STALE = 18,     /* a device stamp whose skb address was reused (head differs) or too old */
	PP_STAT_READY_RACE = 19,    /* two CPUs marked the same socket ready at once: the later one is dropped */
	PP_STAT_SWITCH_IN_UNSEEN = 20,  /* a tracked thread left a CPU whose switch-in was not seen */
	PP_STAT_PIECE_SUPERSEDED = 21,  /* a reply piece followed by another before the receiver answered */
	PP_STAT_PIECE_LATE = 22,    /* a further piece before a request/response receiver read: its wait restarts */
	PP_STAT_HOP_CONTINUED = 23, /* a hop's send without a read (or sleep) since its last: processing continued */
	PP_STAT_HOLDS = 24,         /* requests a hop forwarded through its queue of held requests */
	PP_STAT_HOLD_STALE = 25,    /* held requests never forwarded (answered by the hop itself, superseded): dropped */
	PP_STAT_HOLD_FULL = 26,     /* a hop held more requests than its queue has room for: the oldest was dropped */
	PP_STAT_RETRANSMITS = 28,   /* retransmissions of the run's sockets (tcp_retransmit_skb) */
	PP_STAT_RETX_DELIVERED = 29, /* messages whose wire was split at the retransmission that delivered them */
	PP_STAT_RETX_SLOT_LOST = 30, /* a retransmission's stamp replaced by another connection's (slot collision) */
	PP_STAT_RETX_SETUP = 31,    /* --connect: a setup message delivered by a retransmission: its wait is inside the
				     * connection probe's steps (conn.bpf.c), not a retx_* stage */
	PP_STAT_PIECE_MORE = 32,    /* further pieces of a message into a request/response receiver (stall.bpf.h) */
	PP_STAT_PIECE_BLOCKED = 33, /* ... whose time since the previous piece was send_blocked (the window was full) */
	PP_STAT_SETUP_SPANS = 34,   /* spans of connection-setup messages left out: --connect, the connection probe's; else
				     * pgbench's wait from the server's hello to its first query (its start barrier) and
				     * a backend's setup exchange with pgbench (msg.bpf.h setup_of_pgbench) */
	PP_STAT_CONN_WAIT = 35,     /* --connect: pieces whose wait overlapped their thread opening another connection */
	PP_STAT_NF_QUEUED = 40,     /* a netfilter traversal that went through a queue (NFQUEUE: a delay line) */
	PP_STAT_RELAYED = 41,       /* later parts of a reply a hop read: their stages accounted at its last receiver */
	PP_STAT_OWN_CONN = 42,      /* a tracked process read or wrote on pathprof's own connection (own_conns): skipped */
	PP_STAT_RELAY_SENT = 43,    /* a hop's forward of a later part of a reply: no proc span of its own (its work is
				     * in the receiver's chain, relay.bpf.h), neither paired nor unpaired */
	PP_STAT_THROTTLED_WAITING = 44, /* run-queue waits begun in an unthrottled group that its quota ran out during
					 * (a sibling used it up: sched.bpf.h throttled_since), timed as throttled */
	PP_STAT_CLIENT_CONNS = 45,  /* client connections that sent a request inside a window (once per window) */
	PP_STAT_CLIENT_CYCLE_NS = 46, /* their time from the first such request to the last, summed (msg.bpf.h) */
	PP_NSTATS = 47,   /* 24-27 pooler waits, 28-33 TCP loss and stalls, 34-39 connection setup (reserved) */
};

struct pp_own_key {         /* key of `own_conns`: pathprof's own connection, its client end as the server side
			     * sees it (the remote end of the accepted socket), in the namespace it is in */
	__u32 netns;            /* netns inode */
	__u32 addr;             /* IPv4, network order */
	__u16 port;             /* host order */
	__u16 pad;
};

struct pp_stage_key {       /* key of the `stages` hash (dev, USDT) */
	__u8  stage;            /* enum pp_stage */
	__u8  role;
	__u8  leg;              /* enum pp_leg */
	__u8  sub;
	__u32 hop;              /* hop id; ifindex for PP_ST_DEV */
	__u32 netns;            /* netns inode for PP_ST_DEV */
	__u32 pad;
};

struct pp_hist {
	__u64 sum_ns;
	__u64 count;
	__u64 slots[PP_HIST_SLOTS];
};

struct pp_cpu_val {         /* `cpuacc` per-CPU array, one per (role, hop): monotonic sums */
	__u64 oncpu_ns;         /* on-CPU, minus NET softirq and netfilter time that ran inside the thread */
	__u64 utime_ns;         /* tick-sampled user/system time (task->utime/stime deltas): the split ratio */
	__u64 stime_ns;
	__u64 runq_ns;          /* wakeup/preemption -> switch-in */
	__u64 runq_cnt;
	__u64 switches;
	__u64 thr_ns;           /* off CPU while its cgroup was throttled (CPU quota): runnable -> switched in */
	__u64 thr_cnt;
};

struct pp_cpu_state {       /* per CPU */
	__u64 last_switch;      /* last sched_switch on this CPU */
	__u64 excl_at_switch;   /* excl_total then */
	__u64 excl_total;       /* softirq + netfilter ns carved out of whatever task they ran inside */
	__u64 softirq_start;    /* non-zero while a NET softirq runs */
	__u64 nf_in_softirq;    /* netfilter ns inside the running softirq (not carved twice) */
	__u64 other_ns;         /* on-CPU ns of untracked non-idle tasks */
	__u64 softirq_ns[3];    /* NET softirq ns by where it ran: tracked task, idle, other task */
	__u64 softirq_cnt;
	__u64 nf_ns;            /* all netfilter bracket ns (run packets) */
	__u64 cur_tracked;      /* the running task is tracked (set at switch-in) */
	__u64 win;              /* window (its start) this CPU's state belongs to: reset lazily on change */
	__u64 excl_win0;        /* excl_total when this CPU first ran a program in the window */
	__u64 idle_ns;          /* on-CPU ns of this CPU's idle task (pid 0), less the NET softirq/netfilter inside:
	                         * the no-HZ idle time is in it; the rest is the CPU's work of waking from idle */
	__u64 idle_cnt;         /* switches out of the idle task (wakeups from idle that ran a task) */
	/* the running tracked thread's last two throttled intervals (its cgroup's CPU quota used up), copied at its
	 * switch-in so that span_cell carves them out of its spans without a task-storage lookup; 0 = none */
	__u64 thr0_s, thr0_e, thr1_s, thr1_e;
	/* ... and the older ones since it last slept, as one sum over [thro_s, thro_e] (a span longer than two quota
	 * periods: a cold backend's first query, 600 ms at 5 ms per 100 ms) */
	__u64 thro_s, thro_e, thro_ns;
	__u32 thr_hop;
	__u8  thr_role;
	__u8  thr_pad[3];
};

/* Measurement window. The detailed programs are attached only inside windows, so every timestamp kept in a
 * map may be from an earlier window. User space writes start_ns = CLOCK_MONOTONIC (= bpf_ktime_get_ns)
 * *after* attaching, and 0 before detaching; a program that sees 0 does nothing, and anything stamped
 * before start_ns is discarded (PP_STAT_WINDOW_EDGE). */
struct pp_win { __u64 start_ns; };

struct pp_trace {           /* one span of a sampled message (--trace-sample), streamed by ring buffer */
	__u64 ts;               /* start, CLOCK_MONOTONIC ns */
	__u64 dur;
	__u32 pid, tid;         /* the thread in whose context the span was closed */
	__u32 seq;              /* per-socket message number: spans of one message share it */
	__u8  stage, role, leg, hop;
	/* markers (PP_ST_XSEND/XRECV) only, 0 in spans: the socket's IPv4 tuple (network byte order) and the
	 * sequence number of the message's first byte, the same on every host the message crosses */
	__u32 laddr, raddr;
	__u16 lport, rport;     /* host byte order */
	__u32 tcp_seq;
};
#endif
