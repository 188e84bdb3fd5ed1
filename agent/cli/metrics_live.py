"""`--metrics-port N`: serve a run's live figures (pgbench progress, and the probes' stages and CPU once a
measurement window has closed) for a Prometheus scrape while the run goes on.

`serving(port, ui, labels)` wraps the run's Reporter: every progress update it passes on is also kept as the
snapshot the endpoint renders. `run` uses it; `attach` (or anything else that drives a Reporter) can too.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager

from pathprof.agent.run.options import Reporter


class MetricsReporter(Reporter):
    """Passes everything to `inner` and keeps the latest figures as a summary-shaped snapshot."""

    def __init__(self, inner: Reporter, labels: dict):
        self.inner, self.labels = inner, dict(labels)
        self._lock = threading.Lock()
        self._snap: dict | None = None

    def phase(self, text: str) -> None:
        self.inner.phase(text)

    def note(self, text: str) -> None:
        self.inner.note(text)

    def progress(self, pr, probe_snapshot) -> None:
        snap = {**self.labels, "tps": pr.tps, "latency_ms": {"mean": pr.latency_ms}, "elapsed_s": pr.elapsed_s}
        if probe_snapshot:
            snap.update({k: probe_snapshot[k] for k in ("stages", "cpu", "probe_cost_ns_per_txn")
                         if probe_snapshot.get(k) is not None})
        with self._lock:
            self._snap = snap
        self.inner.progress(pr, probe_snapshot)

    def snapshot(self) -> dict | None:
        with self._lock:
            return dict(self._snap) if self._snap else ({**self.labels} if self.labels else None)


@contextmanager
def serving(port: int | None, ui: Reporter, labels: dict):
    """Yield `ui` unchanged without a port; else a MetricsReporter whose figures are served on 127.0.0.1:port
    until the block ends (the server is stopped on every exit path)."""
    if port is None:
        yield ui
        return
    from pathprof.analysis.export.metrics_server import MetricsServer
    rep = MetricsReporter(ui, labels)
    with MetricsServer(port, rep.snapshot) as server:
        ui.note(f"serving live metrics at {server.url}")     # through the reporter: safe under the live view
        yield rep
