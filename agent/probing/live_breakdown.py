"""The live view's stage and CPU breakdown, recomputed after each probe window closes.

The detailed probes only run inside measurement windows (agent.probing.windows), so between windows the
breakdown stays at the last window's figures. Transactions inside the windows are estimated from pgbench's
per-second progress; the final report divides by the exact count from pgbench's per-transaction log.

`breakdown` is the one computation of the live tables (stages, CPU, lost events) for every command: `run`'s
windows (LiveBreakdown, here) and `attach`'s always-on probes (agent.run.observed) both call it, and what it returns
is what the terminal, the --metrics-port endpoint and the progress line show (agent.run.pipeline.LiveFeed).
"""
from __future__ import annotations

import os


def breakdown(frames, txns: int, busy_ns: float, elapsed_ns: float, client: str = "pgbench") -> dict:
    """The live view's stage/CPU tables for `txns` transactions from the probes' frames (stages, cpu, stats)
    and the machine's CPU over the interval they cover; raises when the views cannot be computed (each caller
    decides what the live view shows then)."""
    from pathprof.agent.probing import frames as F
    from pathprof.analysis import stages as views
    stages, cpu, stats = frames
    lv = views.latency_view(stages, txns, 0.0, client=client)      # the client named as the report will
    cv = views.cpu_view(cpu, txns, busy_ns, elapsed_ns, os.cpu_count() or 1, client=client)
    return {"stages": [x for x in lv["stages"] if not x.get("parent")], "cpu": cv["components"],
            "lost_events": sum(v for k, v in stats.items() if k in F.LOSS)}


class LiveBreakdown:
    def __init__(self, session, pgbench_start_mono_ns: int):
        self.session, self.t0 = session, pgbench_start_mono_ns
        self._seen, self._last, self.failed = 0, {}, None

    def _txns(self, windows: list[dict], progress: list) -> float:
        total = 0.0
        for w in windows:
            mid_s = ((w["start_mono_ns"] + w["end_mono_ns"]) / 2 - self.t0) / 1e9
            tps = min(progress, key=lambda p: abs(p.elapsed_s - 0.5 - mid_s)).tps if progress else 0.0
            total += tps * w["elapsed_ns"] / 1e9
        return total

    def refresh(self, progress: list) -> dict:
        """Figures for LiveState (stages, cpu, probe_cost_ns_per_txn, lost_events); {} until a window closed."""
        s = self.session
        windows = list(getattr(s, "windows", []))
        if len(windows) == self._seen or self.failed:
            return self._last
        self._seen = len(windows)
        try:
            txns = self._txns(windows, progress)
            from pathprof.agent.probing.session import windows_asleep_ns
            snap = s.frames(windows_asleep_ns(windows)) if txns > 0 else None
            if snap is None:
                return self._last
            b = breakdown(snap, int(txns), sum(w["busy_ns"] for w in windows),
                          sum(w["elapsed_ns"] for w in windows))
            cost = s.calibration.estimate(snap[2].get("messages", 0))["run_time_ns"]
            self._last = {"stages": b["stages"], "cpu": b["cpu"],
                          "probe_cost_ns_per_txn": cost / txns if cost is not None else None,
                          "lost_events": b["lost_events"]}
        except Exception as e:  # the live view is a convenience; the run and its report must not depend on it
            self.failed = f"live breakdown unavailable: {type(e).__name__}: {e}"
        return self._last
