/* Block devices: the disk's own time.
 * Part of pathprof.bpf.c (one object: every family shares its maps); included in order, not alone. */
#ifndef PATHPROF_BLOCK_BPF_H
#define PATHPROF_BLOCK_BPF_H

/* ---------------- block devices: the disk's own time ----------------
 * Every request completed inside the window (the machine's, not only the run's: writeback and journal
 * commits happen in kernel threads on behalf of everyone), timed from the issue stamp the block layer keeps
 * (io_start_time_ns, else the request's allocation, start_time_ns; both ktime_get_ns like ours): no state of
 * our own. */
#ifdef PP_PRE_518
/* pathprof-510.bpf.o: before 5.11 a request's partition is an hd_struct (its number in its struct device), and before
 * 5.15 a flush's disk is rq->rq_disk, not rq->q->disk */
struct hd_struct___pp { struct device __dev; } __attribute__((preserve_access_index));
struct request___pp { struct hd_struct___pp *part; struct gendisk *rq_disk; } __attribute__((preserve_access_index));

static __always_inline __u32 request_dev(struct request *rq)
{
	struct request___pp *old = (struct request___pp *)rq;
	struct gendisk *gd;
	if (bpf_core_type_exists(struct hd_struct___pp)) {
		struct hd_struct___pp *p = old->part;
		if (p)
			return p->__dev.devt;
		gd = old->rq_disk;
	} else {
		struct block_device *bd = rq->part;
		if (bd)
			return bd->bd_dev;
		gd = bpf_core_field_exists(rq->q->disk) ? (rq->q ? rq->q->disk : 0) : old->rq_disk;
	}
	return gd ? ((__u32)gd->major << 20) | gd->first_minor : 0;
}
#endif

SEC("tp_btf/block_rq_complete")
int BPF_PROG(pp_block_done, struct request *rq, blk_status_t error, unsigned int nr_bytes)
{
	__u64 ws = win_start();
	if (!ws)
		return 0;
	__u64 start = rq->io_start_time_ns ? rq->io_start_time_ns : rq->start_time_ns;
	if (start < ws)
		return 0;                     /* issued before the window (or not stamped) */
	__u64 now = bpf_ktime_get_ns();
	if (now <= start)
		return 0;
#ifdef PP_PRE_518
	__u32 dev = request_dev(rq);
#else
	struct block_device *bd = rq->part;
	struct gendisk *gd = rq->q ? rq->q->disk : 0;   /* a flush has no partition: name the disk */
	__u32 dev = bd ? bd->bd_dev : (gd ? ((__u32)gd->major << 20) | gd->first_minor : 0);
#endif
	struct pp_stage_key k = { .stage = PP_ST_BLOCK, .sub = rq->cmd_flags & 0xff /* REQ_OP_MASK */, .hop = dev };
	stage_add(&k, now - start);
	return 0;
}

#endif /* PATHPROF_BLOCK_BPF_H */
