"""Causes: the per-stage and per-component differences of an explanation, grouped into what a user can act on.

A line item (`softirq.net`, `wire.backend`, `hop.docker-proxy.sys`) answers "where"; a cause answers "why":

  hop <name>          a process on the path (docker-proxy, pgbouncer, pgpool, qemu): its own stages and CPU (with
                      poolwait.<name>, requests it held for want of a server connection), and,
                      when only one of the two runs has it, the extra kernel network work its second connection
                      brings (the network stack, devices and netfilter of every message now crossing two
                      connections instead of one)
  netfilter           netfilter.* stages and the `netfilter` CPU component (rules, conntrack, NAT)
  devices             dev.* (veth, bridge, tap, lo queues)
  link impairment     delay.* and qdisc.*: a delay or rate limit put on a link (--link, netem tables)
  packet loss         retx_*: messages that waited for a TCP retransmission (timeout, fast recovery, probe), and
                      connect.syn_retx / synack_retx / setup_retx: connection setup that waited for one (-C)
  network stack       wire.* and softirq.net: protocol processing between the send and the receiver's socket
  slow reader         send_blocked.*: a message in pieces (a large result) whose sender waited for the receiver's
                      window: the receiver (the client, for a result) not reading as fast as it is sent
  cpu quota           throttled.*: a process held off the CPUs by its cgroup's CPU quota (CFS bandwidth control),
                      however idle the CPUs were; the explanation names the cgroup and its quota (run.json
                      cpu_quotas, with the cgroup's own count of throttled time as the cross-check)
  scheduler           wakeup.*, idle_exit.*, runqueue.*, recv.*, queued.* of the run's own processes: waiting to
                      be woken, for a CPU to leave idle, for a CPU, behind other work; and idle.wakeups, the
                      CPU time of CPUs leaving and re-entering idle
  backend I/O         backend.wal_flush, .data_read, .dirty_write, .wal_buffers_full (deep runs, when both have
                      backend.execute's exclusive parts): the WAL's fsync, reads on misses, write-outs
  backend             backend.* (execute or its other parts, user/sys CPU), postmaster.*, pg_aux.*
  client              client.<client> and the client's CPU (<client>.user/.sys): pgbench, or the program
                      `attach` found (analysis.client)
  connection setup    connect.* (new connection per transaction), and connwait.* (a reply waiting while its
                      pgbench thread is blocked opening another client's connection)
  probes              pathprof's own BPF programs (the CPU basis leaves them out of the gap: they are not the
                      system's; explain.py)
  foreign load        `other`: CPU of processes that are not the run's
  cpu speed           not an item's cause but a share of many (analysis/speed.py): every stage's own CPU work
                      faster or slower by one ratio; taken out of the items before they are grouped here

Everything here is a pure function of an explanation's items.
"""
from __future__ import annotations

from pathprof.analysis.run_model import Summary

KERNEL_NETWORK = ("network stack", "devices", "netfilter")
# deep runs' exclusive parts of backend.execute that are the server's own I/O: the WAL flush (fsync), data
# reads on shared_buffers misses, dirty buffers written out to make room, full WAL buffers
BACKEND_IO = ("backend.wal_flush", "backend.data_read", "backend.dirty_write", "backend.wal_buffers_full")
_SCHED = ("wakeup.", "idle_exit.", "runqueue.", "recv.", "queued.")


def cause_of(name: str, hops: set[str]) -> str:
    """The cause an item belongs to; `hops` are the hop names on either path."""
    if name.startswith(("hop.", "poolwait.")):       # a pooler's held requests are the hop's
        return f"hop {name.split('.')[1]}"
    if name.startswith(_SCHED) or name.startswith("wire."):
        role = name.split(".", 1)[1]
        if role in hops:                     # a hop's receive side belongs to the hop
            return f"hop {role}"
        return "network stack" if name.startswith("wire.") else "scheduler"
    if name.startswith("netfilter"):
        return "netfilter"
    if name.startswith("dev."):
        return "devices"
    if name.startswith(("delay.", "qdisc.")):
        return "link impairment"
    if name.startswith("send_blocked."):
        return "slow reader"
    if name.startswith("throttled."):
        return "cpu quota"
    if name.startswith("retx_") or name in ("connect.syn_retx", "connect.synack_retx", "connect.setup_retx"):
        return "packet loss"
    if name == "softirq.net":
        return "network stack"
    if name == "idle.wakeups":           # CPUs leaving and re-entering idle: the CPU side of idle_exit.*
        return "scheduler"
    if name in BACKEND_IO:
        return "backend I/O"
    if name.startswith(("backend.", "postmaster.", "pg_aux.")):
        return "backend"
    if name.startswith(("client.", "pgbench.")):
        return "client"
    if name.endswith((".user", ".sys")) and name.split(".")[0] not in ("kernel", "hop"):
        return "client"       # the CPU of a client pathprof attached to, by its program's name (analysis.client)
    if name.startswith(("connect.", "connwait.")):
        return "connection setup"
    if name == "probes":
        return "probes"
    if name == "other":
        return "foreign load"
    return "other stages"


def hop_names(summary: dict | Summary) -> set[str]:
    """Hops of a run, from its stage and CPU names (hop.<name>[.user|.sys])."""
    summary = Summary.of(summary)
    names = [s.name if s.name is not None else "" for s in summary.stages]
    names += [c.component if c.component is not None else "" for c in summary.cpu]
    return {n.split(".")[1] for n in names if n.startswith(("hop.", "poolwait.")) and n.count(".") >= 1}


def group(items: list[dict], gap: float, base_hops: set[str], other_hops: set[str]) -> list[dict]:
    """Causes, ranked by share of the gap: [{name, delta_us_per_txn, share_pct, items}]. A hop that only one
    run has takes the kernel network causes with it (see the module doc); with several such hops they are
    shared in proportion to the hops' own deltas."""
    hops = base_hops | other_hops
    new_hops = sorted(hops - (base_hops & other_hops))
    causes: dict[str, dict] = {}
    for it in items:
        c = cause_of(str(it["name"]), hops)
        entry = causes.setdefault(c, {"name": c, "delta_us_per_txn": 0.0, "items": []})
        entry["delta_us_per_txn"] += float(it.get("delta_us_per_txn") or 0.0)
        entry["items"].append(it["name"])
    if new_hops:
        own = {h: abs(causes.get(f"hop {h}", {}).get("delta_us_per_txn", 0.0)) for h in new_hops}
        total_own = sum(own.values())
        for kn in KERNEL_NETWORK:
            moved = causes.pop(kn, None)
            if not moved:
                continue
            for h in new_hops:
                w = own[h] / total_own if total_own else 1.0 / len(new_hops)
                entry = causes.setdefault(f"hop {h}", {"name": f"hop {h}", "delta_us_per_txn": 0.0, "items": []})
                entry["delta_us_per_txn"] += moved["delta_us_per_txn"] * w
                entry["items"] += [n for n in moved["items"] if n not in entry["items"]]
    out = []
    for c in causes.values():
        d = c["delta_us_per_txn"]
        out.append({"name": c["name"], "delta_us_per_txn": round(d, 3),
                    "share_pct": round(d / gap * 100.0, 1) if gap else None, "items": c["items"]})
    return rank(out)


def rank(causes: list[dict]) -> list[dict]:
    """Causes by share of the gap, then (shares equal or absent) by the size of their move."""
    return sorted(causes, key=lambda c: (-(c["share_pct"] if c["share_pct"] is not None else 0.0),
                                         -abs(c["delta_us_per_txn"])))
