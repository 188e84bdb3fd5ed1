// SPDX-License-Identifier: GPL-2.0
/* pp-delayline: pathprof's link delay line, for kernels built without sch_netem (this project's among them).
 *
 *   pp-delayline QUEUE DELAY_NS JITTER_NS LOSS_PPM
 *
 * Binds NFQUEUE number QUEUE (AF_INET) in the calling network namespace, copying packet metadata only: the
 * kernel keeps every queued skb, and this process hands each one back (NF_ACCEPT) DELAY_NS +/- JITTER_NS
 * (uniform) after it was read, in arrival order (a deadline never precedes the one before it: no reordering),
 * or drops it (NF_DROP) with probability LOSS_PPM / 1e6. The same skb then continues its way: pathprof's
 * probes see it leave the hold (pp_hold_end) and pair its device hop and wire as on any other path.
 * Prints "ready" on stdout once bound, then runs until SIGTERM. Sleeps with a 1 ns timer slack and, when
 * permitted, SCHED_FIFO 10, and wakes early by twice its recent timer lateness, so its wakeups add as little as
 * the machine allows; what is left is measured (the stage delay.<dev> is the hold as it happened). */
#define _GNU_SOURCE
#include <arpa/inet.h>   /* before the linux/ headers: glibc's in.h first keeps libc-compat happy */
#include <errno.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_queue.h>
#include <linux/netlink.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define RING 65536                    /* packets held at once; more are dropped by the kernel queue's maxlen */

struct held { uint32_t id; uint32_t verdict; uint64_t due; };
static struct held ring[RING];
static unsigned head, tail;
static volatile sig_atomic_t stop;
static int fd;
static uint16_t queue;

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static void die(const char *what)
{
	fprintf(stderr, "pp-delayline: %s: %s\n", what, strerror(errno));
	exit(1);
}

/* one nfnetlink message of the queue subsystem with one attribute */
static int send_msg(uint16_t type, uint16_t flags, uint16_t attr, const void *data, uint16_t len)
{
	char buf[NLMSG_SPACE(sizeof(struct nfgenmsg)) + NLA_HDRLEN + 64] __attribute__((aligned(4)));
	memset(buf, 0, sizeof(buf));
	struct nlmsghdr *nh = (struct nlmsghdr *)buf;
	nh->nlmsg_type = (NFNL_SUBSYS_QUEUE << 8) | type;
	nh->nlmsg_flags = NLM_F_REQUEST | flags;
	struct nfgenmsg *g = NLMSG_DATA(nh);
	g->nfgen_family = AF_UNSPEC;
	g->version = NFNETLINK_V0;
	g->res_id = htons(queue);
	struct nlattr *a = (struct nlattr *)(buf + NLMSG_SPACE(sizeof(*g)));
	a->nla_type = attr;
	a->nla_len = NLA_HDRLEN + len;
	memcpy((char *)a + NLA_HDRLEN, data, len);
	nh->nlmsg_len = NLMSG_SPACE(sizeof(*g)) + NLA_ALIGN(a->nla_len);
	return send(fd, buf, nh->nlmsg_len, 0) < 0 ? -1 : 0;
}

static void verdict(uint32_t id, uint32_t v)
{
	struct nfqnl_msg_verdict_hdr vh = { .verdict = htonl(v), .id = htonl(id) };
	if (send_msg(NFQNL_MSG_VERDICT, 0, NFQA_VERDICT_HDR, &vh, sizeof(vh)) < 0 && errno != ENOBUFS)
		die("verdict");
}

static void on_term(int sig) { (void)sig; stop = 1; }

int main(int argc, char **argv)
{
	if (argc != 5) {
		fprintf(stderr, "usage: pp-delayline QUEUE DELAY_NS JITTER_NS LOSS_PPM\n");
		return 2;
	}
	queue = (uint16_t)atoi(argv[1]);
	uint64_t delay = strtoull(argv[2], 0, 10), jitter = strtoull(argv[3], 0, 10);
	uint32_t loss = (uint32_t)strtoul(argv[4], 0, 10);
	signal(SIGTERM, on_term);
	signal(SIGINT, on_term);
	prctl(PR_SET_TIMERSLACK, 1UL);
	struct sched_param sp = { .sched_priority = 10 };
	sched_setscheduler(0, SCHED_FIFO, &sp);          /* best effort */
	srand48((long)now_ns());

	fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_NETFILTER);
	if (fd < 0)
		die("netlink socket");
	struct sockaddr_nl sa = { .nl_family = AF_NETLINK };
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		die("bind");
	int one = 1, rcvbuf = 8 << 20;
	setsockopt(fd, SOL_NETLINK, NETLINK_NO_ENOBUFS, &one, sizeof(one));
	setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof(rcvbuf));
	struct nfqnl_msg_config_cmd cmd = { .command = NFQNL_CFG_CMD_BIND, .pf = htons(AF_INET) };
	if (send_msg(NFQNL_MSG_CONFIG, 0, NFQA_CFG_CMD, &cmd, sizeof(cmd)) < 0)
		die("bind queue");
	struct nfqnl_msg_config_params par = { .copy_range = htonl(0), .copy_mode = NFQNL_COPY_META };
	if (send_msg(NFQNL_MSG_CONFIG, 0, NFQA_CFG_PARAMS, &par, sizeof(par)) < 0)
		die("queue params");
	uint32_t maxlen = htonl(RING);
	send_msg(NFQNL_MSG_CONFIG, 0, NFQA_CFG_QUEUE_MAXLEN, &maxlen, sizeof(maxlen));
	printf("ready\n");
	fflush(stdout);

	static char buf[1 << 16] __attribute__((aligned(4)));
	uint64_t last_due = 0, late = 0, target = 0;
	while (!stop) {
		struct timespec tmo, *tp = 0;
		if (head != tail) {
			uint64_t due = ring[tail % RING].due, t = now_ns();
			/* wake early by twice the recent lateness: once for this wakeup, once for the one that read the
			 * packet (both are this process leaving a sleep, on the same machine) */
			target = due > 2 * late ? due - 2 * late : 0;
			uint64_t wait = target > t ? target - t : 0;
			tmo.tv_sec = wait / 1000000000ull;
			tmo.tv_nsec = wait % 1000000000ull;
			tp = &tmo;
		}
		struct pollfd p = { .fd = fd, .events = POLLIN };
		int n = ppoll(&p, 1, tp, 0);
		if (n < 0 && errno != EINTR)
			die("ppoll");
		if (n > 0 && (p.revents & POLLIN)) {
			for (;;) {
				ssize_t len = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
				if (len <= 0)
					break;
				uint64_t t = now_ns();
				for (struct nlmsghdr *nh = (struct nlmsghdr *)buf; NLMSG_OK(nh, (size_t)len);
				     nh = NLMSG_NEXT(nh, len)) {
					if ((nh->nlmsg_type & 0xff) != NFQNL_MSG_PACKET)
						continue;
					struct nlattr *a = (struct nlattr *)((char *)NLMSG_DATA(nh) +
									     NLMSG_ALIGN(sizeof(struct nfgenmsg)));
					int rest = nh->nlmsg_len - NLMSG_SPACE(sizeof(struct nfgenmsg));
					for (; rest >= NLA_HDRLEN && a->nla_len >= NLA_HDRLEN && a->nla_len <= rest;
					     rest -= NLA_ALIGN(a->nla_len),
					     a = (struct nlattr *)((char *)a + NLA_ALIGN(a->nla_len))) {
						if ((a->nla_type & NLA_TYPE_MASK) != NFQA_PACKET_HDR)
							continue;
						struct nfqnl_msg_packet_hdr *ph = (void *)((char *)a + NLA_HDRLEN);
						uint32_t id = ntohl(ph->packet_id);
						uint32_t v = loss && (uint32_t)(drand48() * 1e6) < loss ? NF_DROP : NF_ACCEPT;
						int64_t j = jitter ? (int64_t)((drand48() * 2 - 1) * (double)jitter) : 0;
						uint64_t due = t + delay + j;
						if (due < last_due)
							due = last_due;        /* in order, as netem without reordering */
						last_due = due;
						if (head - tail >= RING) {     /* full: hand it back at once */
							verdict(id, v);
							continue;
						}
						ring[head++ % RING] = (struct held){ id, v, due };
					}
				}
			}
		}
		uint64_t t = now_ns();
		if (n == 0 && target && t > target) {  /* a timed wakeup: how late it was (EWMA, capped at 100 µs) */
			uint64_t l = t - target < 100000 ? t - target : 100000;
			late = late - late / 8 + l / 8;
		}
		while (head != tail && ring[tail % RING].due <= t + 2 * late) {
			verdict(ring[tail % RING].id, ring[tail % RING].verdict);
			tail++;
		}
	}
	while (head != tail) {                 /* let what is held go before leaving */
		verdict(ring[tail % RING].id, NF_ACCEPT);
		tail++;
	}
	return 0;
}
