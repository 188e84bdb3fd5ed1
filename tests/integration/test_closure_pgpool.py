"""pgpool's latency view closes: its children forward a reply to pgbench in pieces between their own round trips
to the backend (four per prepared select 1), so a receiver's wait must start at the reply's last piece, or
pgbench's wakeup overlaps pgpool's and the backend's stages (it over-counted +6 % at 16 clients, +17 % at 96);
and a hop that sends again without reading continues the same message (the two sends per transaction pgpool
makes after forwarding a piece, which were in no stage)."""
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def test_pgpool_latency_closes_at_16_clients(always_on_run):
    doc = always_on_run("pgpool", 16)       # 3 s, --probe-duty 100 (tests/conftest.py; test_hops_probed reads it too)
    closure = doc["closure"]
    assert closure["latency_basis"] == "cycle"
    assert abs(closure["latency_error_pct"]) <= 5.0, closure
    counters = json.loads((Path(doc["run_dir"]) / "run.json").read_text())["probes"]["counters"]
    assert counters["piece_late"] > 0        # the cases the fixes are about did occur in this run
    assert counters["hop_continued"] > 0.5 * doc["transactions"]
    assert counters["proc_unpaired"] < 0.05 * doc["transactions"]   # pgpool made 2 unpaired sends per transaction
