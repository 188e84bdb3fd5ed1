/* PostgreSQL USDT (--probes deep): parse/plan/execute and the waits and I/O inside execute.
 * Part of pathprof.bpf.c (one object: every family shares its maps); included in order, not alone. */
#ifndef PATHPROF_PG_USDT_BPF_H
#define PATHPROF_PG_USDT_BPF_H

/* ---------------- PostgreSQL USDT (--probes deep) ---------------- */
/* Exclusive time. The waits and I/O nest (a commit's XLogFlush waits for WALWriteLock, an LWLock wait; writing
 * a dirty buffer first flushes the WAL up to its LSN), so their inclusive times overlap and cannot be summed.
 * Every boundary of one of them charges the time since the previous boundary to the span that owned it:
 * the outermost open I/O span (wal_flush, dirty_write, wal_full: the waits inside are part of that I/O), else
 * the innermost open wait (lock, lwlock, data_read). Usdt indices below; a span is open while usdt_ts[i] != 0. */
#define PP_U_LOCK 4
#define PP_U_LWLOCK 5
#define PP_U_WAL_FLUSH 6
#define PP_U_DATA_READ 8
#define PP_U_DIRTY_WRITE 9
#define PP_U_WAL_FULL 10

static __always_inline int is_excl(int i)
{
	return i == PP_U_LOCK || i == PP_U_LWLOCK || i == PP_U_WAL_FLUSH || i == PP_U_DATA_READ ||
	       i == PP_U_DIRTY_WRITE || i == PP_U_WAL_FULL;
}

static __always_inline int excl_owner(struct pp_task *t)
{
	int owner = -1;
	__u64 best = ~0ULL;
	const int io[3] = { PP_U_WAL_FLUSH, PP_U_DIRTY_WRITE, PP_U_WAL_FULL };
	const int waits[3] = { PP_U_LOCK, PP_U_LWLOCK, PP_U_DATA_READ };
#pragma unroll
	for (int j = 0; j < 3; j++) {
		__u64 ts = t->usdt_ts[io[j]];
		if (ts && ts < best) {
			best = ts;
			owner = io[j];
		}
	}
	if (owner >= 0)
		return owner;
	best = 0;
#pragma unroll
	for (int j = 0; j < 3; j++) {
		__u64 ts = t->usdt_ts[waits[j]];
		if (ts > best) {
			best = ts;
			owner = waits[j];
		}
	}
	return owner;
}

static __always_inline void excl_boundary(struct pp_task *t, __u64 now)
{
	int owner = excl_owner(t);
	if (owner >= 0 && t->io_mark && now > t->io_mark) {
		struct pp_stage_key k = { .stage = PP_ST_PG_EXCL, .role = t->role, .leg = PP_LEG_SERVER,
					  .sub = (__u8)owner, .hop = t->hop };
		stage_add(&k, now - t->io_mark);
	}
	t->io_mark = now;
}

static __always_inline int usdt_mark(int i, int done, __u8 stage)
{
	__u64 ws = win_start();
	if (!ws)
		return 0;
	struct pp_task *t = cur_task(ws);
	if (!t || i < 0 || i >= PP_NUSDT)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	if (is_excl(i))
		excl_boundary(t, now);
	if (!done) {
		t->usdt_ts[i] = now;
	} else if (t->usdt_ts[i]) {
		struct pp_stage_key k = { .stage = stage, .role = t->role, .leg = PP_LEG_SERVER, .hop = t->hop };
		stage_add(&k, now - t->usdt_ts[i]);
		t->usdt_ts[i] = 0;
	}
	return 0;
}

#define PG_PAIR(name, i, stage) \
	SEC("usdt") int BPF_USDT(pg_##name##_start) { return usdt_mark(i, 0, stage); } \
	SEC("usdt") int BPF_USDT(pg_##name##_done) { return usdt_mark(i, 1, stage); }

PG_PAIR(query, 0, PP_ST_PG_QUERY)
PG_PAIR(parse, 1, PP_ST_PG_PARSE)
PG_PAIR(plan, 2, PP_ST_PG_PLAN)
PG_PAIR(execute, 3, PP_ST_PG_EXECUTE)
PG_PAIR(lock, 4, PP_ST_PG_LOCK)
PG_PAIR(lwlock, 5, PP_ST_PG_LWLOCK)
PG_PAIR(data_read, 8, PP_ST_PG_DATA_READ)
PG_PAIR(dirty_write, 9, PP_ST_PG_DIRTY_WRITE)
PG_PAIR(wal_full, 10, PP_ST_PG_WAL_FULL)

/* functions without a USDT pair: entry and return uprobes (exported symbols of the postgres binary) */
#define PG_CALL(name, i, stage) \
	SEC("uprobe") int BPF_KPROBE(pg_##name##_start) { return usdt_mark(i, 0, stage); } \
	SEC("uretprobe") int BPF_KRETPROBE(pg_##name##_done) { return usdt_mark(i, 1, stage); }

PG_CALL(wal_flush, 6, PP_ST_PG_WAL_FLUSH)

#endif /* PATHPROF_PG_USDT_BPF_H */
