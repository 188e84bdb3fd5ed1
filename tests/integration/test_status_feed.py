"""status.json is kept by every command through the one live feed (agent.run.pipeline.LiveFeed, #23.3): read
while `pathprof attach` and `pathprof run --dsn` are still running, it holds the agent's memory, its maps and
the events counted so far. (`run` on a built path: test_faults.test_cleanup_during_a_live_run_leaves_it_alone.)"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import PATHPROF  # noqa: E402
from foreign_path import foreign_path, pgbench, wait_connected  # noqa: E402

pytestmark = pytest.mark.integration
DSN = "host=127.0.0.1 port={port} user=postgres dbname=postgres"


def _status_while_running(runs_dir: Path, *args: str, timeout_s: float = 60.0) -> tuple[dict, dict]:
    """(status.json as read while pathprof still ran, the run's --json document)."""
    env = {**os.environ, "PATHPROF_RUNS": str(runs_dir)}
    p = subprocess.Popen([*PATHPROF, *args, "--json", "--no-live"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         stdin=subprocess.DEVNULL, text=True, env=env)
    status = None
    try:
        deadline = time.monotonic() + timeout_s
        while status is None and p.poll() is None and time.monotonic() < deadline:
            for path in runs_dir.glob("*/status.json"):
                try:
                    status = json.loads(path.read_text())
                except (OSError, ValueError):    # written by rename, so never torn; gone only with its run
                    pass
            time.sleep(0.2)
        running = p.poll() is None
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 0, err[-3000:]
    assert status is not None and running, ("no status.json while pathprof ran", err[-2000:])
    return status, json.loads(out)


def _check(status: dict, doc: dict) -> None:
    maps = {m["name"]: m for m in status["maps"]}
    assert status["agent_rss_kb"] > 10_000 and status["elapsed_s"] > 0 and status["tps"] >= 0
    assert "tasks" in maps and 0 <= maps["stages"]["entries"] <= maps["stages"]["max_entries"]
    assert "lost" in status["events"]
    assert doc["status"] == "complete" and doc["transactions"] > 0 and doc["stages"]


def test_attach_keeps_status_json(tmp_path):
    runs_dir = tmp_path / "runs"
    with foreign_path() as fp:
        load = pgbench(fp["port"], 2, 60, str(tmp_path))
        try:
            wait_connected(fp["port"], 2)
            status, doc = _status_while_running(runs_dir, "attach", "--port", str(fp["port"]), "--duration", "4")
        finally:
            load.kill()
            load.communicate(timeout=30)
    _check(status, doc)
    assert status["events"]["messages"] > 0        # the probes were on from the start: the load was counted
    # task storage is counted over pathprof's own process tree (agent.run.status.storage_entries): an attached
    # load is not in it, so its entries read 0 here


def test_run_dsn_keeps_status_json(tmp_path):
    runs_dir = tmp_path / "runs"
    with foreign_path() as fp:
        status, doc = _status_while_running(runs_dir, "run", "--dsn", DSN.format(port=fp["port"]), "--clients", "2",
                                            "--duration", "4", "--probe-duty", "100", "--status-every", "1")
    _check(status, doc)
    assert {m["name"]: m for m in status["maps"]}["tasks"]["entries"] >= 1    # pgbench: pathprof's child
