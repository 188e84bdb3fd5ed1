"""Repeats (`compare --repeat`): is a gap real or noise? The TPS spread of repeated runs, each cause's spread over
the pairwise explanations, and whether the two sets' ranges overlap. Moved out of analysis.explain."""
from __future__ import annotations

import statistics
from typing import Iterable

from pathprof.analysis.explain import _num
from pathprof.analysis.run_model import Summary


def spread(summaries: Iterable[dict | Summary]) -> dict:
    """TPS spread of repeated runs of one configuration: n, mean, min, max, stdev (sample; 0 for one run)."""
    tps = [_num(Summary.of(s).tps) for s in summaries]
    if not tps:
        return {"n": 0, "mean": 0.0, "min": 0.0, "max": 0.0, "stdev": 0.0}
    return {
        "n": len(tps),
        "mean": statistics.fmean(tps),
        "min": min(tps),
        "max": max(tps),
        "stdev": statistics.stdev(tps) if len(tps) > 1 else 0.0,
    }


def cause_spread(expl: dict, repeats: list[dict]) -> dict:
    """With --repeat: each cause's (and item's) delta over the pairwise explanations of the repeats (k-th
    baseline run vs k-th other run), as `spread` {min, max} of µs per transaction; a cause whose spread covers
    zero is marked `uncertain` (it may not have moved at all). Returns expl, updated."""
    def ranges(rows_of):
        out: dict[str, list[float]] = {}
        for e in repeats:
            for row in rows_of(e):
                out.setdefault(row["name"], []).append(_num(row.get("delta_us_per_txn")))
        return out
    for rows, key in ((expl.get("causes") or [], "causes"), (expl.get("items") or [], "items")):
        seen = ranges(lambda e, key=key: e.get(key) or [])
        for row in rows:
            vals = seen.get(row["name"], [])
            if len(vals) >= 2:
                row["spread"] = {"min": round(min(vals), 3), "max": round(max(vals), 3), "n": len(vals)}
                row["uncertain"] = min(vals) <= 0.0 <= max(vals)
    return expl


def is_real_gap(base_runs: list[dict | Summary], other_runs: list[dict | Summary]) -> bool:
    """True when the TPS gap exceeds the run-to-run spread: the two sets' [min, max] ranges do not overlap.

    With fewer than two runs on a side there is no measure of noise, so the gap is *not shown* to be real
    (False); the caller should say "run with --repeat" rather than "noise".
    """
    if len(base_runs) < 2 or len(other_runs) < 2:
        return False
    a, b = spread(base_runs), spread(other_runs)
    return a["max"] < b["min"] or b["max"] < a["min"]
