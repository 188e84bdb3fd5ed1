"""A pooler's own counters next to the probes' named wait for it (issue #22): by Little's law, the mean number of
clients waiting in the pooler is the arrival rate of transactions times their mean wait, so

    mean clients waiting (the pooler's counters, sampled)  ~  TPS x the hop's named wait per transaction

The named wait of a hop is `poolwait.<hop>` (a request held while no server connection is free: pgbouncer in
transaction/statement mode) plus, on a path with that one hop, `connect.hop_accept` (a new connection waiting in
the hop's accept queue: pgpool-II with fewer children than clients under -C). Both sides are measured
independently (the pooler counts its queue; the probes time each wait), so the check says whether the named wait
is what the pooler calls waiting. Where the pooler says how many of its server connections (pgbouncer) or children
(pgpool) were busy, that is kept beside it. Pure functions of run.json and the summary."""
from __future__ import annotations

from pathprof.analysis.run_model import ProbeWindow, RunMeta, Summary

HOP_ACCEPT = "connect.hop_accept"
# Little's law on sampled counts: the expectation and the mean agree within this share of the expectation, or
# within half a client (a mean of a few dozen small integers)
AGREE_SHARE, AGREE_ABS = 0.35, 0.5
# the pooler's own timer of the wait against the probes' poolwait: two clocks of the same intervals (pgbouncer's
# is its event loop's cached time), 1.5-3.5 % apart on pools of 1 and 2 here
TIMER_SHARE, TIMER_ABS_US = 0.2, 20.0
# by Little's law the mean number waiting over the clients is the share of the clients' time spent waiting: under
# this share, counted and predicted, nothing waits for a server (what is left is the hop's own accept and read).
# A pooler with at least as many servers as there are clients has one free for each: whatever the queue holds
# then is its own accept (pgpool's 8 children for 4 -C clients: 1.5-2.2 % of their time alone, 5 % once in a full
# suite on a loaded machine), not a wait for a server
NO_WAIT_PCT = 5.0


def _in_windows(samples: list[dict], windows: list[ProbeWindow]) -> list[dict]:
    if not windows:
        return samples
    spans = [(w.start_mono_ns or 0, w.end_mono_ns or 0) for w in windows]
    return [s for s in samples if any(a <= s.get("mono_ns", 0) <= b for a, b in spans)]


def _wait_stages(hop: str, run: RunMeta, stages: dict) -> dict[str, float]:
    """{stage: µs per transaction} of the hop's named wait (module docstring); connect.hop_accept only when the
    hop is the path's one hop (on a longer path it is every hop's accept queue together)."""
    names = [f"poolwait.{hop}"] + ([HOP_ACCEPT] if len(run.services) <= 1 else [])
    return {n: round(float(stages[n].us_per_txn or 0.0), 1) for n in names if n in stages}


def _sampled(row: dict, samples: list[dict]) -> None:
    waiting = [s.get("cl_waiting", 0) for s in samples]
    row["cl_waiting_mean"] = round(sum(waiting) / len(waiting), 2)
    row["cl_waiting_max"] = max(waiting)
    if any("maxwait_us" in s for s in samples):
        row["maxwait_ms"] = round(max(s.get("maxwait_us", 0) for s in samples) / 1000.0, 3)
    busy = [s["servers_busy"] for s in samples if s.get("servers_busy") is not None]
    if busy:
        row["servers_busy_mean"] = round(sum(busy) / len(busy), 2)
    servers = [s["servers"] for s in samples if s.get("servers") is not None]
    if servers:
        row["servers"] = max(servers)
    served = [s for s in samples if s.get("served") is not None]
    if len(served) >= 2 and served[-1]["mono_ns"] > served[0]["mono_ns"]:
        dt = (served[-1]["mono_ns"] - served[0]["mono_ns"]) / 1e9
        row["connections_per_s"] = round((served[-1]["served"] - served[0]["served"]) / dt, 1)


def _timed(row: dict, samples: list[dict], windows: list[ProbeWindow]) -> None:
    """The pooler's own clock of the wait, where it keeps one (pgbouncer's SHOW STATS total_wait_time): its µs of
    clients waiting per transaction it served, from the first to the last sample of each window."""
    waited = served = 0
    for window in [_in_windows(samples, [w]) for w in windows] or [samples]:
        inside = [s for s in window if "wait_us_total" in s]
        if len(inside) >= 2:
            waited += inside[-1]["wait_us_total"] - inside[0]["wait_us_total"]
            served += inside[-1]["xacts_total"] - inside[0]["xacts_total"]
    if served > 0:
        row["timed_wait_us_per_txn"] = round(waited / served, 1)
        row["timed_txns"] = served


def _agrees(row: dict) -> bool | None:
    """The pooler's own timer against the probes' poolwait where the pooler times the wait (exact on both sides:
    within TIMER_SHARE or TIMER_ABS_US), else Little's law on the sampled count of waiting clients. The sampled
    count is the weaker check: pgbouncer in statement mode answers SHOW POOLS with 0.6-0.8 of the clients its own
    timer and the probes both say were waiting (2026-11-25, pool of 2, 16 clients: 408 µs probes, 422 µs its timer)."""
    if row.get("timed_wait_us_per_txn") is not None:
        diff = abs(row["timed_wait_us_per_txn"] - row["poolwait_us_per_txn"])
        return diff <= max(TIMER_ABS_US, TIMER_SHARE * row["timed_wait_us_per_txn"])
    if row.get("expected_waiting") is None or row.get("cl_waiting_mean") is None:
        return None
    diff = abs(row["cl_waiting_mean"] - row["expected_waiting"])
    return diff <= max(AGREE_ABS, AGREE_SHARE * row["expected_waiting"])


def _shares(row: dict, clients: int | None) -> None:
    """The share of the clients' time spent waiting for a server, counted and timed (Little's law over clients)."""
    if not clients:
        return
    row["waiting_pct"] = round(100.0 * row["cl_waiting_mean"] / clients, 1)
    row["expected_waiting_pct"] = round(100.0 * row["expected_waiting"] / clients, 1)
    row["enough_servers"] = bool(row.get("servers")) and row["servers"] >= clients
    row["no_wait"] = row["enough_servers"] or (row["waiting_pct"] < NO_WAIT_PCT and
                                               row["expected_waiting_pct"] < NO_WAIT_PCT)


def pooler_check(meta: dict | RunMeta, summary: dict | Summary) -> list[dict]:
    """[{hop, source, servers_are, busy_is, samples, cl_waiting_mean, cl_waiting_max, maxwait_ms?, servers?,
    servers_busy_mean?, connections_per_s?, wait_stages, wait_us_per_txn, poolwait_us_per_txn, tps?,
    expected_waiting?, timed_wait_us_per_txn?, timed_txns?, agrees?, waiting_pct?, expected_waiting_pct?,
    no_wait?}] for every hop whose counters were
    sampled; [] when none were."""
    run = RunMeta.of(meta)
    summary = Summary.of(summary)
    counters = run.pooler_counters or {}
    windows = run.probes.windows
    always_on = run.probes.schedule.always_on if run.probes.schedule else None
    tps = ((summary.windows.tps_in if summary.windows else None) if not always_on else None) or summary.tps
    stages = {s.name: s for s in summary.stages if not s.parent}
    out = []
    for hop, c in sorted(counters.items()):
        samples = _in_windows(c.get("samples") or [], [] if always_on else windows)
        row = {"hop": hop, "source": c.get("source"), "servers_are": c.get("servers_are") or "server connection",
               "busy_is": c.get("busy_is") or "active", "samples": len(samples)}
        if c.get("error"):
            row["error"] = c["error"]
        if samples:
            _sampled(row, samples)
        waits = _wait_stages(hop, run, stages)
        row["wait_stages"] = waits
        row["wait_us_per_txn"] = round(sum(waits.values()), 1)
        row["poolwait_us_per_txn"] = waits.get(f"poolwait.{hop}", 0.0)
        if tps:
            row["tps"] = round(float(tps), 1)
            row["expected_waiting"] = round(tps * row["wait_us_per_txn"] / 1e6, 2)
            if samples:
                _shares(row, summary.clients or run.workload.clients)
        if samples:
            _timed(row, samples, [] if always_on else windows)
        verdict = _agrees(row)
        if verdict is not None:
            row["agrees"] = verdict
        out.append(row)
    return out


def _busy(row: dict) -> str:
    if row.get("servers_busy_mean") is None:
        return ""
    of = f" of {row['servers']}" if row.get("servers") else ""
    noun = row["servers_are"]
    plural = "children" if noun == "child" else noun + "s"
    return f"{row['servers_busy_mean']:.2f}{of} {plural} {row['busy_is']} on average; "


def _check(row: dict) -> str:
    exp = row.get("expected_waiting")
    if exp is None:
        return ""
    waits = " + ".join(f"{n} {us:,.0f} µs" for n, us in row["wait_stages"].items()) or f"poolwait.{row['hop']} 0 µs"
    verdict = "" if row.get("timed_wait_us_per_txn") is not None else _verdict(row)
    return f" (TPS {row['tps']:,.0f} x {waits} per txn predicts {exp:.2f}{verdict})"


def _verdict(row: dict) -> str:
    return {True: ": agrees", False: ": DISAGREES"}.get(row.get("agrees"), "")


def _timer(row: dict) -> str:
    if row.get("timed_wait_us_per_txn") is None:
        return ""
    return (f"; its own timer: {row['timed_wait_us_per_txn']:,.0f} µs of waiting for a {row['servers_are']} per "
            f"transaction against poolwait.{row['hop']} {row['poolwait_us_per_txn']:,.0f} µs{_verdict(row)}")


def describe(row: dict) -> str:
    """One line for the report: the pooler's busy servers and waiting clients against the probes' named wait."""
    if row.get("error"):
        return f"{row['hop']}'s own counters could not be read: {row['error']}"
    if not row.get("samples"):
        return f"{row['hop']}'s own counters: no sample inside the measurement windows"
    noun = row["servers_are"]
    line = (f"{row['hop']}'s own counters ({row['source']}, {row['samples']} samples): {_busy(row)}"
            f"clients waiting for a {noun} {row['cl_waiting_mean']:.2f} on average{_check(row)}, "
            f"at most {row['cl_waiting_max']}{_timer(row)}")
    if row.get("maxwait_ms") is not None:
        line += f"; longest wait {row['maxwait_ms']:.1f} ms"
    if row.get("connections_per_s") is not None:
        line += f"; {row['connections_per_s']:,.0f} client connections a second taken"
    if row.get("waiting_pct") is not None:
        wait = "no client waits for a" if row["no_wait"] else "clients wait for a"
        shares = (f"{row['waiting_pct']:.1f} % of their time by the counters, "
                  f"{row['expected_waiting_pct']:.1f} % by the probes")
        if row["no_wait"] and row.get("enough_servers") and max(row["waiting_pct"], row["expected_waiting_pct"]) \
                >= NO_WAIT_PCT:
            line += (f". No client waits for a {noun} ({row['servers']} for the run's clients): the clients' "
                     f"{shares} in its queue are {row['hop']}'s own accept")
        else:
            line += f". {wait[0].upper() + wait[1:]} {noun}: {shares}"

    return line
