"""What-if predictions from one recorded run: a small closed queueing network solved by MVA (analysis.mva).

The model (printed with every prediction as its assumptions):

  clients     N pgbench connections, each a customer that never stops: send, wait for the result, send again
  CPUs        one queueing centre with as many servers as the host has CPUs; its demand is the run's CPU per
              transaction without the probes. On a run that saturated the CPUs that is the CPU view; on a
              latency-bound run the CPU view also holds the cost of sleeping and waking on idle CPUs, which fades
              under load, so the demand is the CPU work *on the transaction's path* (the latency view's wire,
              netfilter, device, recv, execute, hop and client stages, without the probes' time) and every
              CPU component is scaled to it
  hop <name>  a single-threaded process (pgbouncer, docker-proxy): one server whose demand is its CPU per
              transaction (its service is counted at the CPUs, its waiting for its one thread is added); when its
              messages found it busy >= 90 % of the time it limited the run, and its demand is its thread time
              (busy share / TPS)
  client      pgbench's worker threads (min(clients, CPUs)): a multi-server centre of pgbench's CPU
  WAL flush   (deep runs) backend.wal_flush as a single server: commits wait for the one WAL flush
  row lock    (deep runs, lock waits >= 25 % of the cycle) one lock every transaction takes, held 1 / TPS, the
              commit's WAL flush inside it
  delays      delay.* and qdisc.* (a link's delay line or rate limit), other lock waits and reads as measured,
              and what the queues leave of the cycle: pure delays, the same at every client count
  idle wakeups idle_exit.* (and, on a latency-bound run, the run-queue waits of wakeups onto idle CPUs): a delay
              that happens only while CPUs are idle, scaled by the CPUs' idle share; the CPU view's idle.wakeups
              (the CPUs' own work of waking from idle) is left out of the CPU demand for the same reason

It is anchored on the run: the TPS measured outside the probe windows (nothing attached) at the run's own client
count is reproduced (the CPU demand is scaled on a CPU-bound run, the delays on a latency-bound one), with the
foreign load the run had (`other`: fewer CPUs, and CPUs kept from idling); predictions are then made for the path
with the host's CPUs to itself (or `foreign_cpus`). The band: from this machine's checked predictions of the same
question on the same shape of path when it has enough of them (analysis.prediction_misses), else `_band`.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace

from pathprof.analysis import interleave, lone_client, prediction_misses
from pathprof.analysis.anchor import SATURATED, anchor, centres, solve_base, stage_sum
from pathprof.analysis.client import client_of
from pathprof.analysis.predict_inputs import wal_device
from pathprof.analysis.predict_text import assumptions_of, limited_by
from pathprof.analysis.run_model import Summary
from pathprof.analysis.scenarios import Scenario, _links, apply, parse_link, parse_pg_set, parse_wal_limit
from pathprof.errors import UserError

__all__ = ["Base", "Scenario", "apply", "base_from_run", "base_of", "measured_tps", "parse_link", "parse_pg_set",
           "parse_wal_limit", "predict", "predict_for", "progress_tps"]

# + backend.execute, hop.*, client.pgbench. Not wakeup.* (data ready -> woken onto a busy CPU): a wait for the
# waker's other work, like runqueue.*, not the transaction's own; ~0.1-0.4 µs at one client, and under load it held
# the rest of a softirq's batch (docker-dnat at 16 clients: 53 µs, which made all of its CPU look on the path and
# its 1-client predictions 16-18 % short; without it 8-14 %: docs/MEASUREMENTS.md "Stop 47")
PATH_WORK = ("wire.", "netfilter.", "dev.", "recv.")
FIXED_DELAY = ("delay.", "qdisc.")
LOCK_SHARE = 0.25                # lock waits this share of the cycle: a row lock serialises the transactions


@dataclass
class Base:
    """What the model takes from one run (µs per transaction, unprobed)."""
    clients: int
    ncpu: float                         # CPUs left to the run (host CPUs minus foreign load)
    cpu: dict[str, float]               # CPU component -> µs/txn (scaled to the load-independent work)
    hops: list[str]
    think_us: float                     # pure delays
    idle_us: float                      # idle-wakeup delay on fully idle CPUs
    wal_us: float = 0.0
    lock_us: float = 0.0                # hold time per txn of a row lock every transaction takes (deep runs)
    lock_holds_wal: float = 0.0         # the part of it that is the commit's WAL flush
    round_trips: float = 1.0
    measured_tps: float = 0.0
    regime: str = ""
    band_pct: float = 0.0
    band_parts: dict = field(default_factory=dict)
    delays: dict[str, float] = field(default_factory=dict)    # named fixed delays (for the assumptions)
    notes: list[str] = field(default_factory=list)
    links: dict[str, int] = field(default_factory=dict)        # link or interface name -> directions it delays
    client: str = "pgbench"             # the client's name in stage and component names (analysis.client)
    cpu_scale: float = 1.0
    receivers: int = 2                  # processes woken per transaction (wakeups onto idle CPUs)
    idle_priced: bool = True            # the run showed what a wakeup onto an idle CPU costs
    hop_us: dict[str, float] = field(default_factory=dict)    # a hop's thread time per txn, when not its CPU
    hop_awake: dict[str, float] = field(default_factory=dict)  # a hop's messages: the share that found it awake
    background_util: float = 0.0        # foreign load's share of the CPUs while anchoring (keeps them awake)
    wal_device: dict | None = None      # run.json postgres.wal_device, with device_us: its disk-view µs per txn
    machine: dict = field(default_factory=dict)      # the machine's costs (agent.host.machine_costs) for the run
    delaylines: dict = field(default_factory=dict)   # link -> (delay lines, their CPU µs per txn) a scenario adds
    path_share: float = 1.0             # the share of the CPU demand on the transaction's path (the rest beside it)
    foreign_cpus: float = 0.0           # CPUs other processes used during the run (`other`)
    own_cpus: float = 0.0               # CPUs the run's own processes used (its CPU view, probes included)


def _part(summary: Summary, name: str) -> float:
    """An exclusive part of backend.execute (deep runs), µs per transaction; 0 without it."""
    return sum(float(s.us_per_txn) for s in summary.stages if s.name == name and s.part)


def _path_work(summary: Summary, client_cpu: float | None = None) -> float:
    """The latency view's own-work stages on the transaction's path, µs per transaction; `client_cpu` caps the
    client's stage (under load a client thread's stage also holds its work for its other connections)."""
    names = summary.stages
    client = f"client.{client_of(summary)}"
    own = sum(float(s.us_per_txn) for s in names if s.parent is None
              and (s.name.startswith(PATH_WORK) or s.name.startswith("hop.") or s.name == "backend.execute"))
    client_us = sum(float(s.us_per_txn) for s in names if s.parent is None and s.name == client)
    own += client_us if client_cpu is None else min(client_us, client_cpu)
    io = sum(float(s.us_per_txn) for s in names if s.part and s.name in
             ("backend.wal_flush", "backend.data_read", "backend.lock_wait"))
    return max(own - io, 0.0)


def measured_tps(summary: dict | Summary) -> float:
    """The run's TPS without probes attached (outside the windows) when it has one, else pgbench's: the headline's
    (analysis.summary.headline_tps), which takes the outside rate only when enough of the run was outside."""
    summary = Summary.of(summary)
    return float(summary.tps or 0.0)


def base_from_run(summary: dict | Summary, progress_tps: list[float] | None = None, spec: dict | None = None,
                  machine: dict | None = None, regime: str | None = None) -> Base:
    """The model's inputs from a summary (analysis.summary.summarize); UserError when the run cannot support it.
    `machine`: the machine's costs the run recorded (run.json machine_costs), for what the run never showed.
    `regime`: "cpu-bound" to model the run so whatever its own CPUs say."""
    summary = Summary.of(summary)
    if not summary.cpu:
        raise UserError(f"{summary.run_dir}: no CPU view (the run was made with --probes off or recorded no "
                        "CPU table): the model needs CPU per transaction; record the run with --probes basic")
    if not summary.stages:
        raise UserError(f"{summary.run_dir}: no latency view: the model needs the run's stages")
    if summary.workload.connect:
        raise UserError("runs with a new connection per transaction (-C) are not modelled: connection setup "
                        "serialises on the postmaster, which the model does not represent")
    clients = int(summary.clients or 1)
    ncpu_host = float(summary.host.cpus or 1)
    tps_in = float((summary.windows.tps_in if summary.windows else None) or summary.tps or 0.0)
    comps = {c.component: float(c.us_per_txn) for c in summary.cpu}
    foreign = comps.pop("other", 0.0) * tps_in / 1e6
    comps.pop("probes", None)
    for name in [c for c in comps if c.startswith("idle.wakeups")]:
        comps.pop(name)     # CPUs waking from idle: fades as they fill, priced as idle wakeups (idle_exit.*)
    probe_us = (summary.probe_cost_ns_per_txn or 0.0) / 1e3
    hops = sorted({c.split(".")[1] for c in comps if c.startswith("hop.")})
    wal = _part(summary, "backend.wal_flush")
    view_us = sum(comps.values())
    ncpu = max(ncpu_host - foreign, 1.0)      # what the run had: the model is anchored on it
    # the run's own regime: its own CPU (probes included) against the CPUs foreign load left it
    own_cpus = (view_us + (probe_us if "probes" in {c.component for c in summary.cpu} else 0.0)) * tps_in / 1e6
    # fewer clients than CPUs cannot fill the pool: such a run is anchored on its latency
    regime = regime or ("cpu-bound" if own_cpus >= SATURATED * ncpu and clients >= ncpu_host else "latency-bound")
    b = Base(clients=clients, ncpu=ncpu, cpu=comps, hops=hops, think_us=0.0, idle_us=0.0,
             wal_us=wal, regime=regime, measured_tps=measured_tps(summary), machine=dict(machine or {}),
             client=client_of(summary))
    b.round_trips = max([float(s.count_per_txn or 0) for s in summary.stages
                         if s.name == "wire.backend" and s.leg == "request"] or [1.0]) or 1.0
    client_cpu = comps.get(f"{b.client}.user", 0.0) + comps.get(f"{b.client}.sys", 0.0)
    path = max(_path_work(summary, client_cpu if b.regime == "cpu-bound" else None) - probe_us, 0.0)
    if b.regime == "cpu-bound" and 0 < path < view_us:
        # the CPUs' work no transaction waits for runs beside the path where a CPU is free: at fewer clients
        # only the path's share is on the cycle (analysis.mva, serial_us)
        b.path_share = path / view_us
        b.notes.append(f"of the CPU view's {view_us:.1f} µs per transaction, {path:.1f} µs is work on the "
                       "transaction's path (the latency view's own-work stages); the rest runs beside it where a CPU "
                       "is free")
    if b.regime != "cpu-bound":
        if 0 < path < view_us:
            b.cpu_scale = path / view_us
            b.cpu = {k: v * b.cpu_scale for k, v in comps.items()}
            b.notes.append(f"CPU view {view_us:.1f} µs per transaction at {clients} client(s) includes sleeping and "
                           f"waking on idle CPUs; the work on the transaction's path is {path:.1f} µs, used as "
                           "the CPU demand under load")
    b.delays = {"link delay lines and rate limits": stage_sum(summary, FIXED_DELAY)}
    b.links = _links(spec or {})
    _backend_waits(b, summary, tps_in)
    b.foreign_cpus, b.own_cpus = foreign, own_cpus
    b.background_util = min(foreign / ncpu_host, 0.95)
    if not anchor(b, summary):
        # just under the threshold (a 16-client docker-dnat run: 1.76 of 1.98 CPUs) with the work on its path
        # filling the model's CPUs at its clients: no idle CPU is left to wake onto, and fitted to the cycle's last
        # µs an idle wakeup came out at 5 ms (191 TPS predicted at one client against 24,619 measured)
        b = base_from_run(summary, progress_tps, spec, machine, regime="cpu-bound")
        b.notes.append(f"the run's own processes used {own_cpus:.2f} of {ncpu:.2f} CPUs, and the work on its path "
                       f"fills them at {clients} clients: modelled as CPU-bound")
        return b
    b.background_util = 0.0
    if foreign > 0.05:
        # foreign load is the machine's, not the path's, and under contention it yields its fair share: the
        # model, anchored on the CPUs the run had, predicts the path with the host's CPUs to itself
        b.notes.append(f"foreign load: other processes used {foreign:.2f} CPUs during the run; the model was "
                       f"anchored on the {ncpu:.2f} CPUs left to the path and predicts it with all {ncpu_host:g}")
        b.ncpu = ncpu_host
    _band(b, summary, progress_tps)
    return b


def _backend_waits(b: Base, summary: Summary, tps_in: float) -> None:
    """Deep runs: a row lock that serialises the transactions becomes a queue; other lock waits and reads on
    shared_buffers misses stay delays, as measured."""
    lock, reads = _part(summary, "backend.lock_wait"), _part(summary, "backend.data_read")
    cycle_in = summary.closure.cycle_us or 0.0
    if lock and cycle_in and lock >= LOCK_SHARE * cycle_in and tps_in:
        # transactions queue for one row lock (tpcb-like at scale 1: the branch row): its hold time per
        # transaction is the time between grants, 1 / TPS, at the rate measured without probes (deep probes slow
        # the backend); the commit's WAL flush keeps the share of the hold time it had inside the windows
        b.lock_us = 1e6 / (b.measured_tps or tps_in)
        b.lock_holds_wal = b.lock_us * min(b.wal_us * tps_in / 1e6, 1.0)
        b.notes.append(f"row lock waits are {lock / cycle_in * 100:.0f} % of the cycle: one lock serialises the "
                       f"transactions, held {b.lock_us:.0f} µs per transaction (1 / TPS), {b.lock_holds_wal:.0f} µs "
                       "of it the commit's WAL flush")
    elif lock:
        b.delays["backend lock waits (as measured)"] = lock
    if reads:
        b.delays["backend reads on shared_buffers misses (as measured)"] = reads


def _band(b: Base, summary: Summary, progress_tps: list[float] | None) -> None:
    """Half-width of the band, % of the prediction: the root sum of squares of the run's own spread (the
    coefficient of variation of pgbench's per-second TPS), its worse closure error, and the gap between the TPS
    with probes attached and without (how far the probes moved the system the demands were measured on)."""
    cv = 0.0
    pts = [t for t in (progress_tps or [])[1:] if t > 0]   # the first second holds the start-up
    if len(pts) >= 2:
        mean = sum(pts) / len(pts)
        cv = math.sqrt(sum((t - mean) ** 2 for t in pts) / (len(pts) - 1)) / mean * 100.0
    clo = summary.closure
    closure = max(abs(clo.latency_error_pct or 0.0), abs(clo.cpu_error_pct or 0.0))
    w = summary.windows
    out = w.tps_out if w and (summary.tps_basis or "").startswith("outside") else None   # a reference rate only
    inout = abs(w.tps_in / out * 100.0 - 100.0) if out and w.tps_in else 0.0
    b.band_parts = {"tps_spread_pct": round(cv, 1), "closure_pct": round(closure, 1),
                    "probes_in_out_pct": round(inout, 1)}
    b.band_pct = round(math.sqrt(cv ** 2 + closure ** 2 + inout ** 2), 1)


def assumptions(b: Base) -> list[str]:
    return assumptions_of(b, centres(b, b.clients))


def predict(b: Base, clients: list[int], scenario: Scenario | None = None, foreign_cpus: float = 0.0) -> list[dict]:
    """One row per client count: [{name, clients, tps, tps_low, tps_high, latency_ms, limited_by,
    limited_by_text, assumptions}]. foreign_cpus: CPUs other processes take (a shared machine): fewer CPUs for
    the path, and CPUs kept from idling."""
    sc = scenario or Scenario()
    m = apply(b, sc)
    if foreign_cpus > 0:
        host = m.ncpu
        m = replace(m, ncpu=max(host - foreign_cpus, 0.1), background_util=min(foreign_cpus / host, 0.95),
                    notes=m.notes + [f"asked: other processes take {foreign_cpus:g} of the {host:g} CPUs"])
    rows = []
    for n in clients:
        mn, _ = interleave.at_clients(m, n)    # its CPU per transaction at n clients, when the machine knows it
        mn, _ = lone_client.at_clients(mn, n)  # a lone client's path work, when the machine knows it
        sol = solve_base(mn, n)
        key, text = limited_by(mn, sol, SATURATED)
        plain = not (sc.link_us or sc.pg_set or sc.wal_unthrottled or foreign_cpus)
        asked = prediction_misses.question(b.clients, n, sc.without) if plain else None
        checked, _, checked_from = prediction_misses.band(mn.machine, asked, b.hops)
        half = (checked if checked is not None else mn.band_pct) / 100.0
        rows.append({"name": f"{sc.label()}, {n} clients", "scenario": sc.label(), "clients": n,
                     "tps": round(sol.tps, 1), "tps_low": round(sol.tps * (1 - half), 1),
                     "tps_high": round(sol.tps * (1 + half), 1), "band_pct": round(half * 100, 1),
                     "band_from": checked_from or "the run's own per-second spread, closure and probe effect",
                     "question": asked, "latency_ms": round(sol.cycle_us / 1e3, 4),
                     "limited_by": key, "limited_by_text": text,
                     "utilisation_pct": {k: round(v * 100, 1) for k, v in sol.utilisation.items() if k != "idle"},
                     "assumptions": assumptions(mn)})
        if not m.idle_priced and key == "latency":
            rows[-1]["idle_wakeups_unpriced"] = True
            rows[-1]["note"] = ("the CPUs are not saturated here and the run never showed a wakeup onto an idle CPU: "
                                "this TPS leaves that delay out, too high when the CPUs idle between messages")
    return rows


def progress_tps(run_dir) -> list[float]:
    """pgbench's per-second TPS (-P 1 lines in pgbench/stderr.txt) of a run directory."""
    from pathlib import Path
    path = Path(run_dir) / "pgbench" / "stderr.txt"
    if not path.exists():
        return []
    return [float(m.group(1)) for m in re.finditer(r"progress: [\d.]+ s, ([\d.]+) tps", path.read_text())]


def base_of(rd, summary: dict | Summary | None = None, machine: dict | None = None) -> Base:
    """The model's base from a run directory (analysis.rundir.RunDir); `machine`: the machine's costs to use when
    the run recorded none (a run made before pathprof kept them)."""
    from pathprof.analysis.summary import summarize
    s = Summary.of(summary or summarize(rd))
    run = rd.run
    # what the run recorded wins; a cost it did not know yet (a run made before the machine learned it) is
    # taken from `machine`
    costs = {**(machine or {}), **(run.machine_costs or {})}
    b = base_from_run(s, progress_tps(rd.path), run.topology.spec or {}, costs)
    b.wal_device = wal_device(run, s)
    return b


def predict_for(base_summary: dict | Summary, target: dict | Summary) -> dict | None:
    """The prediction, from the first run of a compare/sweep, of another run's TPS (None when the model cannot
    say): same path with another client count, or the same path without a hop the base had."""
    from pathlib import Path

    from pathprof.analysis.rundir import RunDir
    base_summary, target = Summary.of(base_summary), Summary.of(target)
    if base_summary.run_dir is None:
        return None
    try:
        b = base_of(RunDir.open(Path(base_summary.run_dir)), base_summary)
    except (UserError, KeyError, OSError):
        return None
    sc = Scenario()
    if target.topology != base_summary.topology:
        return None
    from pathprof.analysis.hop_removal import hops_gone
    missing = hops_gone(b.cpu, {c.component: float(c.us_per_txn or 0.0) for c in target.cpu})
    if missing and target.cpu:
        sc = Scenario(without=missing)
    elif target.topology_options != base_summary.topology_options:
        return None
    row = predict(b, [int(target.clients or 1)], sc)[0]
    meas = measured_tps(target)
    row["measured_tps"] = meas
    row["error_pct"] = round((row["tps"] - meas) / meas * 100.0, 1) if meas else None
    row["within_band"] = bool(meas and row["tps_low"] <= meas <= row["tps_high"])
    return row
