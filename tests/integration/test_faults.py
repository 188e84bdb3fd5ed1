"""Faults mid-run: the server killed while pgbench runs. One clear message, a non-zero exit, a run directory
that says `failed` and what broke (and still reports), nothing left behind."""
import json
import os
import signal
import subprocess
import time

import pytest
from conftest import PATHPROF, machine_state, run_pathprof

pytestmark = pytest.mark.integration


def _postmasters(state_prefix: str) -> list[int]:
    out = subprocess.run(["pgrep", "-f", f"postgres -D {state_prefix}"], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def test_postmaster_killed_mid_run_is_reported_as_a_broken_run(runs_dir):
    before = machine_state()
    env = dict(os.environ, PATHPROF_RUNS=str(runs_dir))
    p = subprocess.Popen([*PATHPROF, "run", "--topology", "unix", "--clients", "2", "--duration", "6", "--probes",
                          "basic", "--no-live"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline and not any(runs_dir.glob("*/pgbench/argv.txt")):
        time.sleep(0.2)
    time.sleep(2.5)
    pids = _postmasters("/var/lib/pathprof/state/")
    assert pids, "no postmaster found"
    os.kill(min(pids), signal.SIGKILL)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 2, (p.returncode, err[-2000:])
    line = [x for x in err.splitlines() if x.startswith("pathprof: error:")][-1]
    assert "PostgreSQL server" in line and "broke" in line and "Traceback" not in err
    assert machine_state() == before
    (rd,) = list(runs_dir.iterdir())
    meta = json.loads((rd / "run.json").read_text())
    assert meta["status"] == "failed" and any("PostgreSQL server" in f for f in meta["failure"])
    rep = json.loads(run_pathprof("report", str(rd), "--json", check=True).stdout)
    assert rep["status"] == "failed" and rep["notes"][0].startswith("THE PATH BROKE")
    assert "status" in run_pathprof("report", str(rd), check=True).stdout


def test_hop_killed_mid_run_names_the_hop(runs_dir):
    before = machine_state()
    env = dict(os.environ, PATHPROF_RUNS=str(runs_dir))
    p = subprocess.Popen([*PATHPROF, "run", "--topology", "pgbouncer", "--clients", "2", "--duration", "6",
                          "--probes", "off", "--no-live"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    deadline = time.time() + 60
    while time.time() < deadline and not any(runs_dir.glob("*/pgbench/argv.txt")):
        time.sleep(0.2)
    time.sleep(2.5)
    pids = [int(x) for x in subprocess.run(["pgrep", "-x", "pgbouncer"], capture_output=True,
                                           text=True).stdout.split()]
    assert pids, "no pgbouncer found"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 2, (p.returncode, err[-2000:])
    line = [x for x in err.splitlines() if x.startswith("pathprof: error:")][-1]
    assert "pgbouncer" in line and "broke" in line and "Traceback" not in err
    assert machine_state() == before
    (rd,) = list(runs_dir.iterdir())
    assert json.loads((rd / "run.json").read_text())["status"] == "failed"
