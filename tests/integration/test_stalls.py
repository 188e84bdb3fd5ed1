"""Zero-window and send-buffer stalls (#22.2), the ground truth: a 2 MB result per query to a client whose TCP receive
buffer is 8 KB (tcp_rmem in its namespace), against the same result read at full speed. The backend's sends wait for
the client's window; that wait is a named stage of the response leg (send_blocked.backend) and the view closes.
Before (2026-11-25, nic, 1 client, extended, always on): full speed -21.5 % (the streaming of the result's later
pieces in no stage), tiny buffer +127 % (every segment delivered during one send counted from that send's start).
Since probes/stall.bpf.h: full speed +0.05 %, tiny buffer +0.1 % with send_blocked.backend 10.8 ms of a 17.6 ms
cycle (the full-speed cycle is ~6.3 ms)."""
import json
from pathlib import Path

import pytest
from conftest import run_pathprof

pytestmark = pytest.mark.integration
BENCH = Path(__file__).resolve().parents[2] / "bench" / "stall"


def run(topology: str, runs_dir) -> dict:
    cp = run_pathprof("run", "--topology", topology, "--clients", "1", "--mode", "extended", "--script",
                      f"@{BENCH / 'big_result.sql'}", "--duration", "4", "--probe-duty", "100", "--json", "--no-live",
                      runs_dir=runs_dir)
    assert cp.returncode == 0, cp.stderr[-3000:]
    return json.loads(cp.stdout)


def stage(doc: dict, name: str, leg: str) -> float:
    return sum(s["us_per_txn"] for s in doc["stages"] if s["name"] == name and s["leg"] == leg)


def test_a_window_stall_is_a_stage_and_the_view_closes(tmp_path):
    tiny = run(str(BENCH / "nic_tiny_rcvbuf.toml"), tmp_path / "runs")
    assert abs(tiny["closure"]["latency_error_pct"]) <= 5, tiny["closure"]
    full = run("nic", tmp_path / "runs")
    assert abs(full["closure"]["latency_error_pct"]) <= 5, full["closure"]
    # the stall is the backend's, on the response leg, and it carries the gap between the two runs
    cycle = {d["topology"]: d["closure"]["cycle_us"] for d in (tiny, full)}
    gap = tiny["closure"]["cycle_us"] - full["closure"]["cycle_us"]
    blocked = stage(tiny, "send_blocked.backend", "response") - stage(full, "send_blocked.backend", "response")
    assert gap > 0, cycle
    assert blocked >= 0.7 * gap, (blocked, gap, tiny["stages"])
    assert not [s for s in tiny["stages"] if s["name"].startswith("send_blocked.") and s["leg"] != "response"]


def test_a_reply_relayed_by_a_pooler_closes_and_its_stall_is_the_poolers(tmp_path):
    """Through pgbouncer (3 hosts) the pooler reads the result in parts and forwards each; a later part's chain is
    accounted once, at the client (probes/relay.bpf.h). Before (2026-11-25, same cells): full speed -10.1 / -13.6 %
    (pieces outside pgbouncer's sends in no stage), tiny buffer +43 % (hop.pgbouncer and its waits overlapping the
    client's stall). After: +0.51 % and +0.06 %, send_blocked.pgbouncer 14.0 ms of a 17.6 ms gap."""
    tiny = run(str(BENCH / "pgbouncer_tiny_rcvbuf.toml"), tmp_path / "runs")
    assert abs(tiny["closure"]["latency_error_pct"]) <= 5, tiny["closure"]
    full = run("pgbouncer-3host", tmp_path / "runs")
    assert abs(full["closure"]["latency_error_pct"]) <= 5, full["closure"]
    gap = tiny["closure"]["cycle_us"] - full["closure"]["cycle_us"]
    blocked = (stage(tiny, "send_blocked.pgbouncer", "response")
               - stage(full, "send_blocked.pgbouncer", "response"))
    assert gap > 0, (tiny["closure"], full["closure"])
    assert blocked >= 0.7 * gap, (blocked, gap, tiny["stages"])
    # the pooler's own processing of the parts is still named at full speed (not folded into a wire)
    assert stage(full, "hop.pgbouncer", "response") > 0, full["stages"]
