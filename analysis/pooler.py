"""A pooler's own counters next to the probes' poolwait stage (issue #22): by Little's law, the mean number of
clients waiting in the pooler is the arrival rate of transactions times their mean wait, so

    mean cl_waiting (SHOW POOLS, sampled)  ~  TPS x poolwait.<hop> per transaction

Both sides are measured independently (pgbouncer counts its queue; the probes time each held request), so the
check says whether poolwait is what the pooler calls waiting. Pure functions of run.json and the summary."""
from __future__ import annotations

from pathprof.analysis.run_model import ProbeWindow, RunMeta, Summary


def _in_windows(samples: list[dict], windows: list[ProbeWindow]) -> list[dict]:
    if not windows:
        return samples
    spans = [(w.start_mono_ns or 0, w.end_mono_ns or 0) for w in windows]
    return [s for s in samples if any(a <= s.get("mono_ns", 0) <= b for a, b in spans)]


def pooler_check(meta: dict | RunMeta, summary: dict | Summary) -> list[dict]:
    """[{hop, source, samples, cl_waiting_mean, cl_waiting_max, maxwait_ms, poolwait_us_per_txn,
    expected_waiting}] for every hop whose counters were sampled; [] when none were."""
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
        row = {"hop": hop, "source": c.get("source"), "samples": len(samples)}
        if c.get("error"):
            row["error"] = c["error"]
        if samples:
            waiting = [s.get("cl_waiting", 0) for s in samples]
            row["cl_waiting_mean"] = round(sum(waiting) / len(waiting), 2)
            row["cl_waiting_max"] = max(waiting)
            row["maxwait_ms"] = round(max(s.get("maxwait_us", 0) for s in samples) / 1000.0, 3)
        pw = stages.get(f"poolwait.{hop}")
        row["poolwait_us_per_txn"] = round(float(pw.us_per_txn), 1) if pw else 0.0
        if tps:
            row["expected_waiting"] = round(tps * row["poolwait_us_per_txn"] / 1e6, 2)
        out.append(row)
    return out


def describe(row: dict) -> str:
    """One line for the report."""
    if row.get("error"):
        return f"{row['hop']}'s own counters could not be read: {row['error']}"
    if not row.get("samples"):
        return f"{row['hop']}'s own counters: no sample inside the measurement windows"
    exp = row.get("expected_waiting")
    check = f" (TPS x poolwait.{row['hop']} predicts {exp:.2f})" if exp is not None else ""
    return (f"{row['hop']}'s own counters ({row['source']}, {row['samples']} samples): clients waiting for a server "
            f"connection {row['cl_waiting_mean']:.2f} on average{check}, at most {row['cl_waiting_max']}; "
            f"longest wait {row['maxwait_ms']:.1f} ms")
