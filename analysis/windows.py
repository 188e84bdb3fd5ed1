"""Transactions inside and outside the probes' measurement windows, from pgbench's per-transaction log.

The detailed probes are attached only inside windows (pathprof.agent.probing.session), so the stage and CPU tables
describe the transactions that ended inside them: the views divide by *those* (`in_windows.txns`), close the
latency view against their TPS and mean latency, and the CPU view against the busy time during the windows.
Outside the windows nothing but fork/exit is attached, so TPS outside is the unperturbed rate, and
    probe_overhead_pct     = 1 - TPS in windows / TPS outside   (what the probes cost while attached)
    probe_overhead_run_pct = 1 - TPS of the whole run / TPS outside   (the run's average perturbation,
                             attach/detach edges included)
Each window dict carries {attach,start,end,detached}_{realtime,mono}_ns; the intervals [attach, start) and
(end, detached] (the agent attaching and detaching) count as neither inside nor outside.
pgbench logs each transaction's end time as epoch seconds + µs; a log in another clock (monotonic, small
numbers) is matched against the windows' monotonic times instead.
"""
from __future__ import annotations

import numpy as np

MIN_OUTSIDE_S = 1.0      # less than this outside the windows: no reference rate, no overhead figure
MIN_OUTSIDE_TXNS = 100


def _intervals(windows: list[dict], clock: str) -> tuple[list, list]:
    inside, edges = [], []
    for w in windows:
        get = lambda k: w.get(f"{k}_{clock}_ns")  # noqa: E731
        s, e = get("start"), get("end")
        if s is None or e is None:
            continue
        inside.append((s / 1e3, e / 1e3))
        a, d = get("attach"), get("detached")
        if a is not None and a < s:
            edges.append((a / 1e3, s / 1e3))
        if d is not None and d > e:
            edges.append((e / 1e3, d / 1e3))
    return inside, edges


def _mask(ends: np.ndarray, ivs: list) -> np.ndarray:
    m = np.zeros(len(ends), dtype=bool)
    for lo, hi in ivs:
        m |= (ends >= lo) & (ends < hi)
    return m


def _overlap(ivs: list, lo: float, hi: float) -> float:
    return sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in ivs)


def _part(n: int, dur_us: float, lat: np.ndarray) -> dict:
    lat = lat[lat >= 0]
    return {"txns": int(n), "duration_s": round(dur_us / 1e6, 4),
            "tps": round(n / (dur_us / 1e6), 2) if dur_us > 0 else None,
            "latency_ms_mean": round(float(lat.mean()) / 1e3, 6) if len(lat) else None}


def split(ends_us: np.ndarray, lat_us: np.ndarray, windows: list[dict]) -> dict:
    """ends_us: each transaction's end time (µs); lat_us: its latency (µs). Returns {in_windows,
    outside_windows, edges, probe_overhead_pct, probe_overhead_run_pct, log_clock}."""
    ends = np.asarray(ends_us, dtype="float64")
    lat = np.asarray(lat_us, dtype="float64")
    out = {"in_windows": _part(0, 0.0, lat[:0]), "outside_windows": _part(0, 0.0, lat[:0]),
           "edges": {"txns": 0, "duration_s": 0.0}, "probe_overhead_pct": None, "probe_overhead_run_pct": None,
           "log_clock": None}
    if not len(ends) or not windows:
        return out
    clock = "realtime" if np.median(ends) > 1e15 else "mono"     # µs since 1970 vs since boot
    out["log_clock"] = clock
    inside, edges = _intervals(windows, clock)
    lo, hi = float(np.min(ends - np.clip(lat, 0, None))), float(np.max(ends))   # first start .. last end
    m_in = _mask(ends, inside)
    m_edge = _mask(ends, edges) & ~m_in
    m_out = ~(m_in | m_edge)
    d_in, d_edge = _overlap(inside, lo, hi), _overlap(edges, lo, hi)
    d_out = max(hi - lo - d_in - d_edge, 0.0)
    out["in_windows"] = _part(int(m_in.sum()), d_in, lat[m_in])
    out["outside_windows"] = _part(int(m_out.sum()), d_out, lat[m_out])
    out["edges"] = {"txns": int(m_edge.sum()), "duration_s": round(d_edge / 1e6, 4)}
    tin, tout = out["in_windows"]["tps"], out["outside_windows"]["tps"]
    if tout and d_out / 1e6 >= MIN_OUTSIDE_S and m_out.sum() >= MIN_OUTSIDE_TXNS:
        if tin:
            out["probe_overhead_pct"] = round(100.0 * (1.0 - tin / tout), 2)
        if hi > lo:
            out["probe_overhead_run_pct"] = round(100.0 * (1.0 - len(ends) / ((hi - lo) / 1e6) / tout), 2)
    return out
