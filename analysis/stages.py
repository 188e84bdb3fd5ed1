"""The latency view and the CPU view: pure functions over the probe tables (stages.parquet, cpu.parquet).

How a transaction is split (DESIGN.md "The model"). Each transaction is a chain of messages; every message
is sent by one tracked process and consumed by the next (pgbench -> [hop ->] backend, then back). For each
message the probes measure, back to back, so the stages tile the connection's timeline:

  wire.<receiver>      sender's send syscall entry -> sk_data_ready on the receiving socket, *minus* the
                       netfilter and device time inside it (shown as their own stages); its p50/p99 are of
                       the whole window
  netfilter.<hook>     one hook traversal of the message's data segment (hooks: prerouting, input, forward,
                       output, postrouting; `.<netns>` appended outside the root namespace): time between
                       pathprof's INT_MIN+1 and INT_MAX-1 brackets, i.e. iptables/nftables, conntrack, NAT
  dev.<device>         net_dev_start_xmit -> netif_receive_skb of the same data skb (veth, bridge...; lo only
                       with --probe-lo-device, else inside the wire);
                       for a tap into qemu, -> qemu's read of it
  qdisc.<device>       the data skb in the device's root qdisc, enqueue -> dequeue: where an impaired link's
                       rate limit (topologies.impairments) holds it, on the leg it was sent on
  delay.<device>       the data skb held by the link's delay line (its delay_us/jitter_us, topologies.impairments)
                       on <device>, the end's egress device (its peer's ingress for an end on a bridge)
  wakeup.<receiver>    sk_data_ready -> sched_wakeup of the consuming thread, onto a CPU that was busy
  idle_exit.<receiver> the same, onto a CPU that was idle: the wakeup IPI and the CPU leaving idle (on a VM
                       ~20-30 µs; what makes 1-client paths slow on an idle machine)
  runqueue.<receiver>  woken -> switched onto a CPU (run-queue wait)
  recv.<receiver>      on CPU -> the receive returned the data (poll/epoll return + recv syscall)
  queued.<receiver>    the receiver was already awake when the data arrived: ready -> consumed, i.e. the
                       message waited behind the receiver's other work (pgbench's other connections, ...)
  connwait.pgbench     --connect: the part of a reply's wait (ready -> consumed) during which its pgbench thread
                       was opening another client's connection (libpq's connect blocks the thread until that
                       connection's ReadyForQuery); carved out of the wakeup, recv, runqueue or queued stage
  backend.execute      backend: consumed the request -> started sending the result (server leg)
  retx_<kind>.<recv>   a message that reached <recv> only with a TCP retransmission: from its send to the last
                       retransmission of it (kind: rto = after a retransmission timeout, fast = in fast
                       recovery, probe = a tail loss probe); wire.<recv> is then the retransmission's own trip.
                       Every retransmission of the run's sockets is also counted (tcp_retransmits: leg, kind)
  send_blocked.<sndr>  a message in many pieces (a large result): after a piece that left the receiver's window full
                       (TCP: under one segment of its advertised window left; AF_UNIX: the sender's buffer half full),
                       until the next piece arrived: the sender could not go on until the receiver read (a slow
                       client; PostgreSQL's ClientWrite). Role/hop of the sender, leg of the message; a further
                       piece otherwise splits into the sender's work between its sends (backend.execute) and wire
                       (probes/stall.bpf.h)
  throttled.<proc>     the process was held off the CPUs by its cgroup's CPU quota (CFS bandwidth control: cgroup
                       v2 cpu.max, v1 cpu.cfs_quota_us; Kubernetes CPU limits, systemd CPUQuota=, docker --cpus):
                       from the moment it was switched out (or woken) with its group throttled until it ran again,
                       carved out of whichever span of its own it fell in (a run queue, a message queued behind it,
                       its processing). <proc> is the throttled process, on the leg of the span it interrupted
  poolwait.<hop>       request leg: a client's request held inside the hop while the hop did other work,
                       from its consume to the hop's last other activity before forwarding it: a pooler
                       with no free server connection (pgbouncer's cl_waiting, pgpool's busy children).
                       Each forward upstream takes the oldest request the hop thread holds (poolers serve
                       waiting clients in arrival order); a request the hop answers itself is dropped
                       (stats hold_stale); ~0 when a server connection is free at once
  hop.<name>           a hop process (pgbouncer, pgpool, docker-proxy): consumed -> forwarded. A request's
                       forward starts where its poolwait ends; a response's pairs with the same thread's most
                       recent consume not yet forwarded (an event loop forwards what it read before reading
                       the next connection). On TCP a hop's consume is tcp_rcv_space_adjust, so splice(2)
                       reads (docker-proxy's io.Copy) count too
  hop.qemu (server)    a qemu guest: qemu read the request from the tap -> qemu wrote the response to the
                       tap, per connection: qemu + guest kernel + guest server (the guest is not traced).
                       Into it: wire.qemu (send -> qemu read, with dev.<tap> = tap xmit -> qemu read inside
                       it); out of it: wire.<client> starts at qemu's tap write
  client.pgbench       pgbench: consumed the result -> sent the next transaction (client leg)

A new connection per transaction (--connect, pgbench -C): the summary adds the connection probe's steps as
stages of the leg `connect` (names and meaning in pathprof.analysis.conn_view: connect.tcp_handshake,
connect.hop_accept -- a hop's accept queue: pgpool's wait for a free child --, connect.accept -- the accept
queue --, connect.fork, connect.first_run, connect.backend_init_auth,
connect.ready_delivery, connect.thread_wait -- a closed client waiting for its pgbench thread to reconnect it --,
and, where no backend could be paired with its client (a hop or NAT between them), connect.unsplit),
and the per-message stages above leave out the setup exchange (SSLRequest, startup packet, the server's hello up
to ReadyForQuery), which those steps time: together they tile the cycle, connect to close.

<receiver> is the receiving role (`backend`, `pgbench`) or hop name. Legs: `request` (into a backend, or into
a hop on its service port), `server`, `response` (into pgbench, or into a hop from upstream), `client`.
A stage name can occur on both legs (a hop, netfilter on loopback): (name, leg) identifies a row.
`--probes deep` splits backend.execute (rows with `parent: "backend.execute"`, never summed into the total).
Its *parts* (`part: true`) are exclusive and add up to it: the waits backend.lock_wait, backend.lwlock_wait
and the backend's I/O: backend.wal_flush (a commit waiting for its WAL to be written and flushed, fsync
included, and the WALWriteLock waits inside; XLogFlush), backend.data_read (blocks read from the kernel on
shared_buffers misses), backend.dirty_write (dirty buffers written out to make room, with the WAL flush that
needs), backend.wal_buffers_full (WAL buffers full) -- each its exclusive time (`inclusive_us` beside it) --
and backend.execute.other, what they leave (executor/planner CPU, protocol, run-queue waits inside the span).
Its *phases* (`phase: true`: backend.query, .parse, .plan, .executor) overlap the parts and are only shown.
Runs recorded before the exclusive times existed show the parts inclusive and no `other`.

CPU view components (CPU µs per transaction; they add up to the CPUs' busy time):
  <role>.user / <role>.sys      on-CPU time of the run's threads by role (pgbench, backend, postmaster,
                                pg_aux.<kind>: walwriter, checkpointer, ...), from sched_switch, minus the
                                softirq/netfilter time carved out of
                                it; the user/sys split is the tick-sampled utime:stime ratio
  hop.<name>.user / .sys        the same for each hop's processes
  softirq.net                   NET_RX/NET_TX softirq time, wherever it ran (inside a task, idle, ksoftirqd)
  netfilter                     the run's packets inside netfilter hooks (all packets, ACKs included)
  other                         every other non-idle task on the machine
  idle.wakeups                  CPU busy while no task ran: the idle loop leaving and re-entering sleep, and the
                                interrupts and non-NET softirqs an idle CPU woke for (the idle tasks' on-CPU
                                time less the kernel's no-HZ idle sleep); ~5 µs per wakeup from idle on a VM,
                                ~0 on saturated CPUs. Runs whose busy time is tick-sampled (busy_source "tick",
                                recorded before 1.2) have none
The busy time they close against (run.json busy_source "nohz") is the CPUs' time not asleep in the kernel's
no-HZ idle accounting, ns-precise; /proc/stat's busy fields are tick samples that miss work started right after
a tick (TCP retransmission and loss-probe timers), kept as busy_tick_ns.
"""
from __future__ import annotations

import pandas as pd
from pathprof.analysis.client import DEFAULT as DEFAULT_CLIENT
from pathprof.analysis.client import PROBE_ROLE, label
from pathprof.analysis.histogram import merge, quantile

LAT_KINDS = ("wire", "wakeup", "idle_exit", "runqueue", "recv", "queued", "proc", "netfilter", "dev", "qdisc", "delay",
             "connwait", "poolwait", "retx_rto", "retx_fast", "retx_probe", "send_blocked", "throttled")
INSIDE_WIRE = ("netfilter", "dev", "qdisc", "delay")   # measured inside a wire span: carved out of it
USDT_NAMES = {"pg_query": "backend.query", "pg_parse": "backend.parse", "pg_plan": "backend.plan",
              "pg_wal_flush": "backend.wal_flush",
              "pg_data_read": "backend.data_read", "pg_dirty_write": "backend.dirty_write",
              "pg_wal_full": "backend.wal_buffers_full",
              "pg_execute": "backend.executor", "pg_lock": "backend.lock_wait", "pg_lwlock": "backend.lwlock_wait"}
# The waits and I/O that probes/pathprof.bpf.c also times exclusively (PP_ST_PG_EXCL): with those, they are
# backend.execute's parts (they add up to it with backend.execute.other); query/parse/plan/executor are phases
# that overlap them, shown but never summed
EXCLUSIVE = ("pg_wal_flush", "pg_data_read", "pg_dirty_write", "pg_wal_full", "pg_lock", "pg_lwlock")
LEG_ORDER = {"request": 0, "server": 1, "response": 2, "client": 3, "": 4}
CPU_BOUND_SHARE = 0.9   # busy >= 90 % of all CPUs: throughput is CPU-limited


def _label(role: str, hop: str, client: str = DEFAULT_CLIENT) -> str:
    return hop if hop else label(role, client)


def stage_name(kind: str, role: str, hop: str = "", hook: str = "", netns: str = "", dev: str = "",
               client: str = DEFAULT_CLIENT) -> str:
    """The stable name of a stages.parquet row (see the module docstring); the client's role is named `client`
    (pgbench, or the program `attach` found: analysis.client)."""
    if kind == "proc":
        if hop:
            return f"hop.{hop}"
        if role == PROBE_ROLE:
            return f"client.{client}"
        return {"backend": "backend.execute"}.get(role, f"hop.{role}")
    if kind == "netfilter":
        return f"netfilter.{hook}" + (f".{netns}" if netns and netns != "root" else "")
    if kind in ("dev", "qdisc", "delay"):
        return f"{kind}.{dev}"
    if kind in USDT_NAMES:
        return USDT_NAMES[kind]
    return f"{kind}.{_label(role, hop, client)}"


def latency_view(stages: pd.DataFrame, txns: int, measured_mean_us: float, cycle_us: float | None = None,
                 client: str = DEFAULT_CLIENT) -> dict:
    """Mean µs per transaction per stage (+ p50/p99 per occurrence) and the closure.

    The stages tile each connection's timeline, so their sum is the per-connection cycle time
    (clients / TPS). Pass `cycle_us` and the closure is checked against it (closure_basis "cycle");
    otherwise against pgbench's measured mean latency ("latency"), which leaves out the part of
    client.pgbench spent between one transaction's end and the next one's start (logging, and pgbench
    waiting for a CPU when they are saturated): a few % at 1 client, much more at 16 on 2 CPUs.

    Returns {stages: [{name, leg, us_per_txn, p50_us, p99_us, count_per_txn[, parent]}], total_us,
    closure_error_pct, closure_basis, netfilter_packets_per_txn, scheduler: [{role, runq_us_mean,
    wakeups_per_txn}]}.
    """
    out = {"stages": [], "total_us": 0.0, "closure_error_pct": None, "closure_basis": None,
           "netfilter_packets_per_txn": 0.0, "scheduler": []}
    if stages is None or not len(stages) or not txns:
        return out
    rows, excl = _collect(stages, txns, out, client)
    _wire_exclusive(rows)
    out["stages"] = [_stage_item(e, txns, excl) for e in rows.values()]
    if excl:
        out["execute_split"] = _execute_other(out["stages"])
    out["stages"].sort(key=lambda s: (LEG_ORDER.get(s["leg"], 9), "parent" in s, "phase" in s, -s["us_per_txn"]))
    total = sum(s["us_per_txn"] for s in out["stages"] if "parent" not in s)
    out["total_us"] = round(total, 3)
    ref, out["closure_basis"] = (cycle_us, "cycle") if cycle_us else (measured_mean_us, "latency")
    if ref:
        out["closure_error_pct"] = round((total - ref) / ref * 100.0, 2)
    out["netfilter_packets_per_txn"] = round(out["netfilter_packets_per_txn"], 2)
    return out


def _collect(stages: pd.DataFrame, txns: int, out: dict, client: str = DEFAULT_CLIENT) -> tuple[dict, dict]:
    """Time stages summed by (name, leg); counters (netfilter packets, run-queue waits, retransmissions) into
    `out`; the backend's exclusive wait and I/O ns by kind."""
    df = stages.fillna({"hop": "", "hook": "", "netns": "", "dev": "", "leg": "", "role": ""})
    rows: dict[tuple, dict] = {}
    excl: dict[str, int] = {}         # exclusive ns of the backend's waits and I/O, by the owning span's kind
    for r in df.itertuples(index=False):
        kind = r.kind
        if kind == "nf_all":
            out["netfilter_packets_per_txn"] += r.count / txns
            continue
        if kind == "sched_runq":
            out["scheduler"].append({"role": _label(r.role, r.hop, client), "runq_us_mean": r.sum_ns / r.count / 1e3,
                                     "wakeups_per_txn": r.count / txns})
            continue
        if kind == "sched_throttled":  # every throttled interval of the role's threads, whatever span it fell in
            out.setdefault("throttled", []).append({"role": _label(r.role, r.hop), "ns": int(r.sum_ns),
                                                    "intervals": int(r.count)})
            continue
        if kind == "retx_count":      # retransmissions, not time: counted per outgoing leg and kind
            out.setdefault("tcp_retransmits", []).append({"leg": r.leg, "kind": r.hook or "other",
                                                          "sender": _label(r.role, r.hop, client),
                                                          "count": int(r.count)})
            continue
        if kind == "setup_retx":      # -C: inside the connection probe's steps, moved out there (conn_view)
            out.setdefault("setup_retx", []).append({"where": r.hook, "sum_ns": int(r.sum_ns), "count": int(r.count)})
            continue
        if kind == "pg_excl":
            if r.role == "backend":
                excl[r.hook] = excl.get(r.hook, 0) + int(r.sum_ns)
            continue
        if kind not in LAT_KINDS and kind not in USDT_NAMES:
            continue
        if kind in USDT_NAMES and r.role != "backend":
            continue                  # the walwriter's or checkpointer's own I/O is not on a transaction's path
        name = stage_name(kind, r.role, r.hop, r.hook, r.netns, r.dev, client)
        key = (name, r.leg)
        e = rows.setdefault(key, {"name": name, "leg": r.leg, "kind": kind, "sum_ns": 0, "count": 0, "hists": []})
        e["sum_ns"] += int(r.sum_ns)
        e["count"] += int(r.count)
        e["hists"].append(getattr(r, "hist", None))
    return rows, excl


def _wire_exclusive(rows: dict) -> None:
    """Wire is reported exclusive of the netfilter/device/qdisc time inside it, leg by leg (shared pro rata
    when a leg has several wires, e.g. client -> hop and hop -> backend). A message in pieces whose sender waited
    for the receiver's window (send_blocked) had segments cross the devices during that wait too: what the wires
    cannot hold is carved out of send_blocked, so the leg's sum stays the time it took."""
    for leg in {k[1] for k in rows}:
        inner = sum(e["sum_ns"] for (n, lg), e in rows.items() if lg == leg and e["kind"] in INSIDE_WIRE)
        for kind in ("wire", "send_blocked"):
            wires = [e for (n, lg), e in rows.items() if lg == leg and e["kind"] == kind]
            total = sum(e["sum_ns"] for e in wires)
            share = min(inner, total)
            for e in wires:
                e["excl_ns"] = e["sum_ns"] - share * e["sum_ns"] / total if total else 0.0
            inner -= share


def _stage_item(e: dict, txns: int, excl: dict) -> dict:
    """One stage's row: µs per transaction, p50/p99 per occurrence, count; USDT stages under backend.execute
    (its exclusive parts when the waits were split, else phases)."""
    h = merge(e["hists"])
    p50, p99 = quantile(h, 0.5), quantile(h, 0.99)
    item = {"name": e["name"], "leg": e["leg"], "us_per_txn": round(e.get("excl_ns", e["sum_ns"]) / txns / 1e3, 3),
            "p50_us": None if p50 is None else round(p50 / 1e3, 2),
            "p99_us": None if p99 is None else round(p99 / 1e3, 2),
            "count_per_txn": round(e["count"] / txns, 3)}
    if e["kind"] in USDT_NAMES:
        item["parent"] = "backend.execute"
        if excl and e["kind"] in EXCLUSIVE:
            item["part"], item["inclusive_us"] = True, item["us_per_txn"]
            item["us_per_txn"] = round(excl.get(e["kind"], 0) / txns / 1e3, 3)
        elif excl:
            item["phase"] = True
    return item


def _execute_other(stages: list[dict]) -> dict:
    """Add `backend.execute.other` (what the exclusive parts leave of backend.execute: executor and planner CPU,
    protocol handling, run-queue waits inside the span) and return the split's own check: the parts must not add
    up to more than their parent (`other_raw_us` < 0 would mean overlap or window-edge mismatch)."""
    execute = sum(s["us_per_txn"] for s in stages if s["name"] == "backend.execute" and "parent" not in s)
    parts = sum(s["us_per_txn"] for s in stages if s.get("part"))
    other = execute - parts
    stages.append({"name": "backend.execute.other", "leg": "server", "us_per_txn": round(max(other, 0.0), 3),
                   "p50_us": None, "p99_us": None, "count_per_txn": None, "parent": "backend.execute", "part": True})
    return {"execute_us": round(execute, 3), "parts_us": round(parts, 3), "other_raw_us": round(other, 3),
            "parts_pct": round(parts / execute * 100.0, 2) if execute else None}


def cpu_view(cpu: pd.DataFrame, txns: int, busy_ns: int, elapsed_ns: int, ncpu: int, *,
             clients: int | None = None, latency_us: float | None = None, probe_us: float | None = None,
             client: str = DEFAULT_CLIENT) -> dict:
    """CPU µs per transaction per component, closure against the CPUs' busy time, regime, predicted TPS.

    busy_ns: CPU time not idle/iowait over the measured interval (all CPUs; the no-HZ idle time where the run
    recorded it, busy_source "nohz", else /proc/stat's tick samples); elapsed_ns: wall time of it.
    probe_us: the probes' own run time per transaction (pathprof.agent.probing.cost). It ran inside the
    components' time, so it is carved out of them in proportion to their CPU time (the programs run in the
    context of whatever they trace) and shown as the component `probes`: every other component is then what
    the application costs without pathprof, and the sum (the closure) is unchanged.
    predicted_tps is the *unprobed* system's: cpu-bound -> CPUs the run had / its CPU per transaction without
    the probes; latency-bound with `clients` and `latency_us` (the latency view's total) -> clients / (latency
    - probe time), the probes' runs being on the transaction's path. predicted_probed_tps is the same model
    with the probes left in: it checks the model against the TPS measured while they were attached.
    """
    out = {"components": [], "total_us": 0.0, "closure_error_pct": None, "busy_cpus": None, "regime": None,
           "predicted_tps": None, "predicted_probed_tps": None}
    if busy_ns and elapsed_ns:
        out["busy_cpus"] = round(busy_ns / elapsed_ns, 3)
        out["regime"] = "cpu-bound" if busy_ns / elapsed_ns >= CPU_BOUND_SHARE * ncpu else "latency-bound"
    if cpu is None or not len(cpu) or not txns:
        return out
    comp_ns, comp_host = _components(cpu, client)
    probe_ns = _carve_probes(comp_ns, (probe_us or 0.0) * 1e3 * txns)
    comps = [{"component": n, "us_per_txn": round(ns / txns / 1e3, 3), **({"host": comp_host[n]} if n in comp_host
                                                                         else {})}
             for n, ns in comp_ns.items() if ns > 0]
    comps.sort(key=lambda c: (c["component"] in ("other", "probes"), -c["us_per_txn"]))
    out["components"] = comps
    total_ns = sum(comp_ns.values())
    out["total_us"] = round(total_ns / txns / 1e3, 3)
    if busy_ns:
        out["closure_error_pct"] = round((total_ns - busy_ns) / busy_ns * 100.0, 2)
    run_ns = total_ns - comp_ns.get("other", 0.0)
    if out["regime"] == "latency-bound" and clients and latency_us:
        out["predicted_probed_tps"] = round(clients * 1e6 / latency_us, 1)
        unprobed_us = latency_us - probe_ns / txns / 1e3
        out["predicted_tps"] = round(clients * 1e6 / unprobed_us, 1) if unprobed_us > 0 else None
    elif run_ns > 0 and elapsed_ns:
        run_cpus = max((busy_ns or total_ns) / elapsed_ns - comp_ns.get("other", 0.0) / elapsed_ns, 0.0)
        out["predicted_probed_tps"] = round(run_cpus * 1e9 / (run_ns / txns), 1)
        if run_ns > probe_ns:
            out["predicted_tps"] = round(run_cpus * 1e9 / ((run_ns - probe_ns) / txns), 1)
    return out


def tick_closure_pct(cv: dict, txns: int, busy_tick_ns: float) -> float | None:
    """What the CPU closure would have been before 1.2: the components without idle.wakeups against /proc/stat's
    tick-sampled busy time (the report's comparison; the closure itself is against the no-HZ busy time)."""
    if not busy_tick_ns or not txns:
        return None
    idle_us = sum(c["us_per_txn"] for c in cv["components"] if c["component"].startswith("idle.wakeups"))
    total_ns = (cv["total_us"] - idle_us) * 1e3 * txns
    return round((total_ns - busy_tick_ns) / busy_tick_ns * 100.0, 2)


def _components(cpu: pd.DataFrame, client: str = DEFAULT_CLIENT) -> tuple[dict[str, float], dict[str, str]]:
    """CPU ns per component name, and (a merged run's table has a `host` column) the host of each: a name that
    several hosts have is named per host (`softirq.net@host`), except `other` (untracked tasks), summed."""
    df = cpu.fillna({"role": "", "hop": "", "where": ""})
    hosts = df["host"].fillna("").astype(str).tolist() if "host" in df.columns else [""] * len(df)
    rows = []
    for r, host in zip(df.itertuples(index=False), hosts):
        if r.comp in ("user", "sys"):
            name = f"hop.{r.hop}.{r.comp}" if r.hop else f"{label(r.role, client) or 'kernel'}.{r.comp}"
        elif r.comp == "softirq":
            name = "softirq.net"
        elif r.comp == "idle":
            name = "idle.wakeups"
        else:
            name = str(r.comp)
        rows.append((name, host, float(r.ns)))
    hosts_of: dict[str, list[str]] = {}
    for name, host, _ in rows:
        if host and host not in hosts_of.setdefault(name, []):
            hosts_of[name].append(host)
    comp_ns: dict[str, float] = {}
    comp_host: dict[str, str] = {}
    for name, host, ns in rows:
        shared = len(hosts_of.get(name, [])) > 1
        key = f"{name}@{host}" if shared and name != "other" else name
        comp_ns[key] = comp_ns.get(key, 0.0) + ns
        if host:
            comp_host[key] = "+".join(hosts_of[name]) if name == "other" else host
    return comp_ns, comp_host


def _carve_probes(comp_ns: dict[str, float], probe_ns: float) -> float:
    """Move probe_ns out of the run's own components (not `other`) into `probes`, in proportion to their
    time; returns what was moved (at most what they had)."""
    own = {n: v for n, v in comp_ns.items() if n != "other" and v > 0}
    total = sum(own.values())
    probe_ns = min(max(probe_ns, 0.0), total)
    if probe_ns <= 0:
        return 0.0
    for n, v in own.items():
        comp_ns[n] = v - probe_ns * v / total
    comp_ns["probes"] = probe_ns
    return probe_ns


def disk_view(stages: pd.DataFrame, txns: int) -> list[dict]:
    """The block devices' own time while the probes were attached (kind "block": every request the machine
    completed, not only the run's): per device and operation, requests and µs of device time per transaction,
    and the mean and p99 of one request."""
    if stages is None or not len(stages) or not txns or "kind" not in stages:
        return []
    out = []
    for r in stages[stages.kind == "block"].itertuples(index=False):
        if not r.count:
            continue
        p99 = quantile(getattr(r, "hist", None), 0.99)
        out.append({"device": r.dev, "op": r.hook, "requests_per_txn": round(r.count / txns, 4),
                    "us_per_txn": round(r.sum_ns / txns / 1e3, 3), "mean_us": round(r.sum_ns / r.count / 1e3, 1),
                    "p99_us": None if p99 is None else round(p99 / 1e3, 1)})
    return sorted(out, key=lambda d: -d["us_per_txn"])


def probe_cost_ns_per_txn(cost: dict | None, txns: int) -> float | None:
    """Total BPF program run time (bpf_stats) per transaction."""
    if not cost or not txns or cost.get("run_time_ns") is None:
        return None
    return round(cost["run_time_ns"] / txns, 1)
