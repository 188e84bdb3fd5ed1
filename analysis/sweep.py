"""Client sweeps: where throughput stops growing, and what grows with the client count.

A pure function of summary documents (one per client count, same topology), like analysis.explain, read through
the typed run model (analysis.run_model.Summary).
"""
from __future__ import annotations

import math

from pathprof.analysis.explain import _num, cpu_totals, run_label, stage_totals
from pathprof.analysis.run_model import Summary

# Throughput "stops growing" when a doubling of clients buys less than this (or TPS drops).
KNEE_GAIN_PER_DOUBLING_PCT = 5.0


def _gain_per_doubling(c0: float, t0: float, c1: float, t1: float) -> float | None:
    """Percent TPS gain normalised to one doubling of clients, so 1→4 and 16→24 steps are comparable."""
    if c0 <= 0 or c1 <= c0 or t0 <= 0:
        return None
    doublings = math.log2(c1 / c0)
    if t1 <= 0:
        return -100.0
    return ((t1 / t0) ** (1.0 / doublings) - 1.0) * 100.0


def _growth(first: dict[str, float], last: dict[str, float]) -> list[dict]:
    names = list(dict.fromkeys([*first, *last]))
    rows = [{"name": n, "first_us_per_txn": round(first.get(n, 0.0), 3), "last_us_per_txn": round(last.get(n, 0.0), 3),
             "delta_us_per_txn": round(last.get(n, 0.0) - first.get(n, 0.0), 3)} for n in names]
    rows.sort(key=lambda r: -r["delta_us_per_txn"])
    return rows


def sweep_analysis(summaries: list[dict | Summary]) -> dict:
    """Per-client-count TPS/latency, the knee, and the stage and CPU component that grow most with clients.

    Keys: `topology`, `points` [{clients, tps, latency_ms {mean,p50,p95,p99}, regime, predicted_tps,
    gain_per_doubling_pct}], `knee_clients` (the last client count that still paid off, None if throughput grew
    all the way), `knee_reason`, `cpus`, `stage_growth` / `cpu_growth` (ranked, first → last point),
    `growing_stage`, `growing_component` (None when nothing grew).
    """
    runs = sorted((s for s in map(Summary.of, summaries) if s.clients is not None), key=lambda s: _num(s.clients))
    points = []
    knee, reason = None, None
    for i, s in enumerate(runs):
        gain = None
        if i:
            prev = runs[i - 1]
            gain = _gain_per_doubling(_num(prev.clients), _num(prev.tps), _num(s.clients), _num(s.tps))
            if knee is None and gain is not None and gain < KNEE_GAIN_PER_DOUBLING_PCT:
                knee = prev.clients
                reason = (f"TPS dropped {abs(gain):.1f} % per doubling from {knee} to {s.clients} clients"
                          if gain < 0 else
                          f"only {gain:+.1f} % TPS per doubling from {knee} to {s.clients} clients")
        lat = s.latency_ms
        points.append({
            "clients": s.clients,
            "tps": _num(s.tps),
            "latency_ms": {"mean": lat.mean, "p50": lat.p50, "p95": lat.p95, "p99": lat.p99},
            "regime": s.regime,
            "predicted_tps": s.predicted_tps,
            "gain_per_doubling_pct": None if gain is None else round(gain, 1),
        })

    stage_growth = _growth(stage_totals(runs[0]), stage_totals(runs[-1])) if len(runs) > 1 else []
    cpu_growth = _growth(cpu_totals(runs[0]), cpu_totals(runs[-1])) if len(runs) > 1 else []
    cpus = None
    for s in runs:
        cpus = s.host.cpus or cpus
    return {
        "topology": run_label(runs[0]) if runs else None,
        "points": points,
        "knee_clients": knee,
        "knee_reason": reason,
        "cpus": cpus,
        "stage_growth": stage_growth,
        "cpu_growth": cpu_growth,
        "growing_stage": stage_growth[0]["name"] if stage_growth and stage_growth[0]["delta_us_per_txn"] > 0 else None,
        "growing_component": cpu_growth[0]["name"] if cpu_growth and cpu_growth[0]["delta_us_per_txn"] > 0 else None,
    }


def sweep_text(analysis: dict) -> str:
    """One sentence: where throughput stops growing and what grows with clients."""
    topo = analysis.get("topology") or "this path"
    pts = analysis.get("points") or []
    if len(pts) < 2:
        return f"{topo}: a sweep needs at least two client counts"
    knee = analysis.get("knee_clients")
    if knee is None:
        head = f"{topo}: throughput still grows at {pts[-1]['clients']} clients"
    else:
        best = max(pts, key=lambda p: p["tps"])
        head = (f"{topo}: throughput stops growing after {knee} clients ({analysis.get('knee_reason')}; "
                f"best {best['tps']:,.0f} TPS at {best['clients']} clients)")
        if analysis.get("cpus"):
            head += f"; the host has {analysis['cpus']} CPUs"
    grows = []
    for key, rows in (("growing_stage", "stage_growth"), ("growing_component", "cpu_growth")):
        name = analysis.get(key)
        if name:
            row = analysis[rows][0]
            what, unit = (("CPU component", "µs CPU per transaction") if key == "growing_component"
                          else ("stage", "µs per transaction"))
            grows.append(f"the {what} that grows most is {name} "
                         f"({row['first_us_per_txn']:.1f} → {row['last_us_per_txn']:.1f} {unit})")
    return head + ("; " + "; ".join(grows) if grows else "")
