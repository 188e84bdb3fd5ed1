/* Layout of nf.bpf.c's in-flight bracket state (mirrored in pathprof.agent.bpf.layout). */
#ifndef PATHPROF_NF_H
#define PATHPROF_NF_H
#include "common.h"

/* Per-CPU bracket slots: a hook traversal runs on one CPU without sleeping, so the INT_MIN+1 program
 * parks {skb, ts} in slot[hook] and the INT_MAX-1 program picks it up -- no hash map on the packet
 * path. A softirq can interrupt a process-context traversal of the same hook (e.g. a TCP ACK sent
 * from softirq during OUTPUT), so each hook has a second, nested slot. */
#define PP_NF_SLOTS 10

struct pp_nf_slot {
	__u64 skb;
	__u64 ts;
	__u32 saddr, daddr;     /* tuple at the first bracket: a change at the second one = NAT */
	__u16 sport, dport;
	__u8  leg;
	__u8  data;             /* carries payload */
	__u8  pad[2];
};
#endif
