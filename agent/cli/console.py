"""Terminal side of a run: phases and live progress on stderr, the final report on stdout."""
from __future__ import annotations

import sys
import time
from contextlib import contextmanager

from pathprof.agent.run.options import Reporter


class PlainReporter(Reporter):
    """Progress as plain lines on stderr (used when stderr is not a terminal, or with --no-live)."""

    def __init__(self, stream=sys.stderr, duration_s: float = 0, every_s: float = 5.0):
        self.stream, self.duration_s, self.every_s = stream, duration_s, every_s
        self._last = 0.0

    def phase(self, text: str) -> None:
        print(f"pathprof: {text}", file=self.stream, flush=True)

    def note(self, text: str) -> None:
        print(f"pathprof: note: {text}", file=self.stream, flush=True)

    def progress(self, pr, probe_snapshot) -> None:
        now = time.monotonic()
        if now - self._last < self.every_s and pr.elapsed_s < self.duration_s:
            return
        self._last = now
        print(f"pathprof: {pr.elapsed_s:5.0f}/{self.duration_s} s  {pr.tps:10.1f} tps  "
              f"lat {pr.latency_ms:.3f} ms  failed {pr.failed}", file=self.stream, flush=True)


class LiveReporter(Reporter):
    """Feeds the rich live view (agent/cli/live.py) from pgbench progress and probe snapshots."""

    def __init__(self, view, duration_s: float):
        from pathprof.agent.cli.live import LiveState
        self.view, self.state = view, LiveState(elapsed_s=0, duration_s=duration_s)

    def phase(self, text: str) -> None:
        self.state.phase = text
        self.view.update(self.state)

    def note(self, text: str) -> None:
        self.view.console_print(f"note: {text}")

    def progress(self, pr, snap) -> None:
        self.state.elapsed_s, self.state.tps, self.state.latency_ms = pr.elapsed_s, pr.tps, pr.latency_ms
        if snap:
            self.state.stages = snap.get("stages", self.state.stages)
            self.state.cpu = snap.get("cpu", self.state.cpu)
            self.state.probe_cost_ns_per_txn = snap.get("probe_cost_ns_per_txn")
            self.state.lost_events = snap.get("lost_events", 0)
        self.view.update(self.state)


@contextmanager
def make_reporter(a, duration_s: float):
    if not getattr(a, "no_live", False) and sys.stderr.isatty():
        try:
            from pathprof.agent.cli.live import LiveView
        except ImportError:
            LiveView = None
        if LiveView is not None:
            with LiveView(stream=sys.stderr) as view:
                yield LiveReporter(view, duration_s)
            return
    yield PlainReporter(sys.stderr, duration_s)


def print_report(summary, stream=sys.stdout) -> None:
    """One run's report (a Summary of analysis.run_model, or a summary dict) as the terminal view."""
    try:
        from pathprof.analysis.report.render import render_to_string, report_view
    except ImportError:
        stream.write(plain_report(summary))
        return
    stream.write(render_to_string(report_view(summary)))


def plain_report(summary) -> str:
    from pathprof.analysis.run_model import Summary
    s = Summary.of(summary)
    lat = s.latency_ms

    def fmt(v):
        return "-" if v is None else f"{v:.3f}"
    lines = [f"topology {s.topology}  clients {s.clients}  duration {s.duration_s} s",
             f"tps {s.tps:.1f}  latency ms: mean {fmt(lat.mean)}  p50 {fmt(lat.p50)}  "
             f"p95 {fmt(lat.p95)}  p99 {fmt(lat.p99)}",
             f"regime {s.regime}  run dir {s.run_dir}"]
    for st in s.stages:
        lines.append(f"  {st.leg:<9} {st.name:<28} {st.us_per_txn:10.2f} us/txn")
    for c in s.cpu:
        lines.append(f"  cpu {c.component:<28} {c.us_per_txn:10.2f} us/txn")
    return "\n".join(lines) + "\n"
