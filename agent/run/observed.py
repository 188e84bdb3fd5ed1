"""The observed load driver of the measurement pipeline (agent.run.pipeline): no pgbench, the traffic already
flowing to the server (`attach`). A transaction is one request/response exchange on a client connection, counted
by the probes themselves (`exchanges`); the live progress (`watch`) and run.json `observed` (`observed_result`)
come from the probes alone, with the request + server + response legs as the latency (`leg_mean_us`).
Moved from attach.py (#23) unchanged."""
from __future__ import annotations

import os
import time

from pathprof.agent.postgres.pgbench import Progress
from pathprof.agent.run.options import Reporter
from pathprof.agent.run.pipeline import LiveFeed


def exchanges(stages) -> int:
    """Request/response exchanges: requests the backends consumed and answered (else, with the server out of
    sight, the first hop's)."""
    if stages is None or not len(stages):
        return 0
    proc = stages[stages["kind"] == "proc"]
    n = int(proc[proc["role"] == "backend"]["count"].sum())
    if not n:
        hop = proc[(proc["leg"] == "request") & (proc["hop"] != "")]
        n = int(hop.groupby("hop")["count"].sum().max()) if len(hop) else 0
    if not n:                 # the clients' host of a remote server (--remote): the clients' own work per exchange
        n = int(proc[proc["role"] == "pgbench"]["count"].sum())
    return n


def observed_result(presult, path) -> tuple[dict, dict]:
    """run.json `observed` (what pgbench's result holds for a driven run) and `cpu`, from the probes alone."""
    wins = presult.windows or []
    elapsed = sum(w.get("elapsed_ns", 0) for w in wins)
    from pathprof.agent.probing.windows import cpu_in_windows
    cpu = cpu_in_windows(wins)
    n = exchanges(presult.stages)
    tps = n / (elapsed / 1e9) if elapsed else 0.0
    mean_us = leg_mean_us(presult.stages, n, path.client_connections, tps)
    observed = {"source": "probes", "tps": round(tps, 2), "transactions": n, "failed": None,
                "latency_ms": {"mean": round(mean_us / 1e3, 6) if mean_us else None},
                "duration_s": round(elapsed / 1e9, 3), **clients_time(getattr(presult, "counters", None) or {}, n)}
    cpu.pop("windows")
    return observed, {**cpu, "elapsed_ns": elapsed, "ncpu": os.cpu_count()}


def clients_time(counters: dict, n: int) -> dict:
    """run.json observed {active_connections, client_s}: the client connections that sent a request in the
    interval, and their time from each one's first request to its last (probes/msg.bpf.h client_cycle), scaled
    from the transactions between those requests (one fewer than its requests per connection) to the n counted:
    the latency view's cycle is client_s / n, as a driven run's (analysis.summary). A connection that sent
    nothing -- an idle one in an application's pool -- is no client's time; counted as one, with two idle beside
    two busy pgbench clients the view closed at -50 %. {} when the probes did not count them (a server whose
    clients are on another host, an older object)."""
    conns, cycle_ns = int(counters.get("client_conns") or 0), float(counters.get("client_cycle_ns") or 0)
    if not conns or n <= conns or cycle_ns <= 0:
        return {"active_connections": conns} if conns else {}
    return {"active_connections": conns, "client_s": round(cycle_ns / 1e9 * n / (n - conns), 6)}


def leg_mean_us(stages, n: int, connections: int, tps: float) -> float | None:
    """attach's transaction latency, µs: the request, server and response legs per exchange (the client's own
    time between exchanges is the rest of the cycle). One definition for the live view and the final report."""
    from pathprof.analysis import stages as views
    if not n or not tps:
        return None
    cycle = connections * 1e6 / tps
    lv = views.latency_view(stages, n, cycle, cycle_us=cycle)
    legs = [s["us_per_txn"] for s in lv["stages"] if s["leg"] in ("request", "server", "response")
            and "parent" not in s]
    return sum(legs) if legs else None


def watch(probes, path, duration_s: float, ui: Reporter, feed: LiveFeed | None = None, tick=None,
          client: str = "pgbench") -> None:
    """Progress once a second from the probes' own exchange count (the live view's TPS line), with the stage
    and CPU breakdown so far (the probes are always on here: no window to wait for), into `feed` (attach's
    keeps status.json); `tick`, when given, is called after every second."""
    from pathprof.agent.host.machine import cpu_times
    feed = feed if feed is not None else LiveFeed(probes, ui)
    t0, cpu0 = time.monotonic(), cpu_times()
    last_n, last_t, reported = 0, t0, False
    while True:
        now = time.monotonic()
        if now - t0 >= duration_s:
            return
        time.sleep(min(1.0, duration_s - (now - t0)))
        if reported and time.monotonic() - t0 >= duration_s:
            return      # the interval ends on time, not one look or read of the maps later (hosts' agents end
            # together: beside another load a look at the sockets took ~0.5 s, 10-16 % of a 4-s interval)
        if tick is not None:
            tick()
        reported = True
        cpu = cpu_times()     # the probes' idle tasks' time since their reset less the CPUs' sleep since t0
        nohz = cpu["busy_source"] == cpu0["busy_source"] == "nohz"
        frames = probes.frames(cpu["asleep_ns"] - cpu0["asleep_ns"] if nohz else None)
        n = exchanges(frames[0]) if frames else 0
        t = time.monotonic()
        tps = (n - last_n) / (t - last_t) if t > last_t else 0.0
        last_n, last_t = n, t
        try:      # the live view is a convenience: a figure it cannot compute yet is 0, the run goes on
            mean_us = leg_mean_us(frames[0], n, path.client_connections, n / (t - t0)) if frames else None
        except Exception:
            mean_us = None
        feed(Progress(elapsed_s=round(t - t0, 1), tps=tps, latency_ms=(mean_us or 0.0) / 1e3),
             breakdown(frames, n, (cpu["busy_ns"] if nohz else cpu["busy_tick_ns"])
                       - (cpu0["busy_ns"] if nohz else cpu0["busy_tick_ns"]), (t - t0) * 1e9, client))


def breakdown(frames, n: int, busy_ns: float, elapsed_ns: float, client: str = "pgbench") -> dict:
    """The live view's stage/CPU tables so far (agent.probing.live_breakdown.breakdown over the exchanges the
    probes counted); {} when there is nothing yet or it cannot be computed (the live view is a convenience: the
    run must not depend on it)."""
    if not frames or not n:
        return {}
    from pathprof.agent.probing import live_breakdown
    try:
        return live_breakdown.breakdown(frames, n, busy_ns, elapsed_ns, client)
    except Exception:
        return {}
