"""The live view's stage and CPU breakdown, recomputed after each probe window closes.

The detailed probes only run inside measurement windows (agent.probing.windows), so between windows the
breakdown stays at the last window's figures. Transactions inside the windows are estimated from pgbench's
per-second progress; the final report divides by the exact count from pgbench's per-transaction log.
"""
from __future__ import annotations

import os


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
            from pathprof.agent.probing import frames as F
            from pathprof.analysis import stages as views
            txns = self._txns(windows, progress)
            snap = s.frames() if txns > 0 else None
            if snap is None:
                return self._last
            stages, cpu, stats = snap
            lv = views.latency_view(stages, int(txns), 0.0)
            cv = views.cpu_view(cpu, int(txns), sum(w["busy_ns"] for w in windows),
                                sum(w["elapsed_ns"] for w in windows), os.cpu_count() or 1)
            cost = s.calibration.estimate(stats.get("messages", 0))["run_time_ns"]
            self._last = {"stages": [x for x in lv["stages"] if not x.get("parent")],
                          "cpu": cv["components"],
                          "probe_cost_ns_per_txn": cost / txns if cost is not None else None,
                          "lost_events": sum(v for k, v in stats.items() if k in F.LOSS)}
        except Exception as e:  # the live view is a convenience; the run and its report must not depend on it
            self.failed = f"live breakdown unavailable: {type(e).__name__}: {e}"
        return self._last
