"""attach's live latency (the progress line, and so pathprof_latency_seconds) is the quantity its final report
gives: the mean of the request + server + response legs, not the connection's cycle."""
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
from pathprof.agent.discovery.chain import DiscoveredPath
from pathprof.agent.run import attach
from pathprof.agent.run.options import Reporter

RUN = Path(__file__).parent / "data" / "runs" / "pgbouncer-traces"


class Probes:
    """The session's read side over a recorded run's stages (what the probes had counted so far)."""

    def __init__(self, stages):
        self.stages = stages

    def frames(self, asleep_ns=None):
        cpu = pd.read_parquet(RUN / "cpu.parquet")
        return self.stages, cpu, {}

    def snapshot(self):
        return {}


class Progress(Reporter):
    def __init__(self):
        self.seen = []

    def progress(self, pr, snap):
        self.seen.append(pr.latency_ms)


def test_live_latency_is_the_final_reports_latency():
    stages = pd.read_parquet(RUN / "stages.parquet")
    path = DiscoveredPath(client_connections=8)
    ui = Progress()
    attach._watch(Probes(stages), path, 0.2, ui)
    elapsed = 2_000_000_000       # the final figure's own rate does not enter the leg sum
    final, _ = attach.observed_result(SimpleNamespace(stages=stages, windows=[{"elapsed_ns": elapsed}]), path)
    assert ui.seen and final["latency_ms"]["mean"]
    assert abs(ui.seen[-1] - final["latency_ms"]["mean"]) <= 1e-6 * final["latency_ms"]["mean"], \
        (ui.seen, final["latency_ms"])


def test_start_at_waits_for_the_time_given_or_says_how_late():
    import time

    import pytest
    from pathprof.errors import UserError
    notes = []
    ui = SimpleNamespace(phase=lambda s: None, note=notes.append)
    t0 = time.time()
    assert attach._wait_for_start(t0 + 0.3, ui) is None and time.time() - t0 >= 0.29
    assert attach._wait_for_start(time.time() - 1.5, ui) == pytest.approx(1.5, abs=0.1) and "ago" in notes[0]
    assert attach._wait_for_start(None, ui) is None
    for bad in (time.time() + 7200, time.time() - 600):      # refused before anything is loaded or recorded
        with pytest.raises(UserError, match="--start-at .* within the next hour"):
            attach.execute_attach(attach.AttachOptions(port=1, start_at=bad), ui)
