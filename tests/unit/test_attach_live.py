"""attach's live latency (the progress line, and so pathprof_latency_seconds) is the quantity its final report
gives: the mean of the request + server + response legs, not the connection's cycle."""
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
from pathprof.agent.discovery.chain import DiscoveredPath
from pathprof.agent.run import attach
from pathprof.agent.run.observed import clients_time
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
    from pathprof.agent.run import start_at
    from pathprof.errors import UserError
    notes = []
    ui = SimpleNamespace(phase=lambda s: None, note=notes.append)
    t0 = time.time()
    assert start_at.wait(t0 + 0.3, ui) is None and time.time() - t0 >= 0.29
    late = start_at.wait(time.time() - 1.5, ui)
    assert late == pytest.approx(1.5, abs=0.1) and "ago" in notes[0]
    assert "1.5" in start_at.late_note(late) and start_at.late_note(None) is None
    assert start_at.wait(None, ui) is None
    for bad in (time.time() + 7200, time.time() - 600):      # refused before anything is loaded or recorded
        with pytest.raises(UserError, match="--start-at .* within the next hour"):
            attach.execute_attach(attach.AttachOptions(port=1, start_at=bad), ui)


def test_run_start_at_goes_with_dsn_and_a_near_time():
    """run --start-at starts pgbench at a wall-clock time (hosts' agents aligned): only with --dsn (a built path's
    build time is pathprof's own), and a time within the next hour, refused before anything is built or loaded."""
    import time

    import pytest
    from pathprof.agent.cli.args import build_parser, run_options
    from pathprof.agent.run.dsn import execute_dsn
    from pathprof.errors import UserError
    parser = build_parser()
    with pytest.raises(UserError, match="--start-at goes with --dsn"):
        run_options(parser.parse_args(["run", "--start-at", f"{time.time() + 5:.3f}"]), "loopback")
    a = parser.parse_args(["run", "--dsn", "host=127.0.0.1 port=1", "--start-at", f"{time.time() + 7200:.3f}"])
    opts = run_options(a, "loopback")
    assert opts.start_at == pytest.approx(a.start_at)
    with pytest.raises(UserError, match="--start-at .* within the next hour"):
        execute_dsn(opts, SimpleNamespace(phase=lambda s: None, note=lambda s: None))


def test_the_clients_time_is_each_connections_first_request_to_its_last():
    # two connections sent requests: 1,002 transactions counted, 1,000 of them between a connection's first
    # request and its last (one fewer per connection), over 2 s of the connections' own time in all
    got = clients_time({"client_conns": 2, "client_cycle_ns": 2_000_000_000}, 1002)
    assert got == {"active_connections": 2, "client_s": pytest.approx(2.0 * 1002 / 1000)}
    assert clients_time({}, 1002) == {}                       # not counted (a server whose clients are away)
    assert clients_time({"client_conns": 3, "client_cycle_ns": 5}, 3) == {"active_connections": 3}
