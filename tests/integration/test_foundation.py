"""The foundation for real, as root: paths build, pgbench runs through them, teardown restores the machine."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest
from conftest import PATHPROF, machine_state, run_pathprof
from pathprof.analysis.schemas import load

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("topology", ["unix", "loopback", "nic"])
def test_topology_runs_and_leaves_nothing(topology, runs_dir):
    before = machine_state()
    cp = run_pathprof("run", "--topology", topology, "--clients", "2", "--duration", "1", "--probes", "off",
                      "--json", runs_dir=runs_dir, check=True)
    doc = json.loads(cp.stdout)
    assert doc["topology"] == topology and doc["clients"] == 2 and doc["duration_s"] == 1
    assert doc["tps"] > 0 and doc["transactions"] > 0
    lat = doc["latency_ms"]
    assert 0 < lat["mean"] and lat["p50"] <= lat["p95"] <= lat["p99"]
    rd = Path(doc["run_dir"])
    meta = json.loads((rd / "run.json").read_text())
    assert meta["status"] == "complete" and meta["host"]["cpus"] == os.cpu_count()
    assert meta["pgbench"]["argv"][0].endswith("pgbench") and "-M" in meta["pgbench"]["argv"]
    assert list((rd / "pgbench" / "log").glob("pgbench_log.*.gz"))
    assert meta["postgres"]["version"].startswith("15")
    jsonschema.validate(meta, load("run"))        # the real documents keep the shipped contract
    jsonschema.validate(doc, load("summary"))
    assert machine_state() == before
    assert meta["journal"] and not Path(f"/var/lib/pathprof/journal/{meta['journal']}.jsonl").exists()


def test_pg_set_and_tables(runs_dir):
    cp = run_pathprof("run", "--topology", "unix", "--clients", "2", "--duration", "2", "--probes", "off",
                      "--script", "select-only", "--scale", "2", "--pg-set", "shared_buffers=48MB",
                      "--pg-set", "fsync=off", "--json", runs_dir=runs_dir, check=True)
    doc = json.loads(cp.stdout)
    meta = json.loads((Path(doc["run_dir"]) / "run.json").read_text())
    assert meta["postgres"]["settings"]["shared_buffers"] == "48MB"
    assert meta["postgres"]["settings"]["fsync"] == "off"
    assert doc["tps"] > 0 and "-b" in meta["pgbench"]["argv"]


def _wait_for(pred, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return False


def _postgres_pids(marker: str) -> list[int]:
    out = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def test_sigkill_mid_run_then_cleanup_restores(runs_dir):
    before = machine_state()
    env = dict(os.environ, PATHPROF_RUNS=str(runs_dir))
    p = subprocess.Popen([*PATHPROF, "run", "--topology", "nic", "--clients", "2", "--duration", "30", "--probes",
                          "off"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         start_new_session=False)
    try:
        assert _wait_for(lambda: any(runs_dir.glob("*/pgbench/argv.txt")), 60), "run never reached pgbench"
        time.sleep(1)
        assert Path("/run/netns/pp-nic-srv").exists()
        assert _postgres_pids("/var/lib/pathprof/state/")
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    assert Path("/run/netns/pp-nic-srv").exists(), "a SIGKILLed run cannot tear down; its objects stay"
    cp = run_pathprof("cleanup", check=True)
    assert "pp-nic-srv" in cp.stdout
    assert _wait_for(lambda: not _postgres_pids("/var/lib/pathprof/state/"), 10)
    assert machine_state() == before
    assert run_pathprof("cleanup").stdout.strip() == "nothing to clean up"


def test_sigkill_of_a_run_nobody_reaps_then_cleanup_restores(runs_dir, tmp_path):
    """In a container whose PID 1 never reaps, a killed pathprof stays a zombie: cleanup must take it as dead."""
    before = machine_state()
    env = dict(os.environ, PATHPROF_RUNS=str(runs_dir))
    pidfile = tmp_path / "pid"
    # the parent starts pathprof, writes its pid and sleeps without ever waiting for it
    parent = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time; p = subprocess.Popen(sys.argv[2:], stdout=subprocess.DEVNULL, "
        "stderr=subprocess.DEVNULL); open(sys.argv[1], 'w').write(str(p.pid)); time.sleep(600)"),
        str(pidfile), *PATHPROF, "run", "--topology", "nic", "--clients", "2", "--duration", "30", "--probes", "off"],
        env=env)
    try:
        assert _wait_for(lambda: any(runs_dir.glob("*/pgbench/argv.txt")), 60), "run never reached pgbench"
        pid = int(pidfile.read_text())
        os.kill(pid, signal.SIGKILL)
        assert _wait_for(lambda: Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z", 10)
        cp = run_pathprof("cleanup", check=True)
        assert "pp-nic-srv" in cp.stdout and "is live" not in cp.stdout, cp.stdout
        assert _wait_for(lambda: not _postgres_pids("/var/lib/pathprof/state/"), 10)
        assert machine_state() == before
    finally:
        parent.kill()
        parent.wait()


def test_ctrl_c_during_setup_tears_down(runs_dir):
    before = machine_state()
    env = dict(os.environ, PATHPROF_RUNS=str(runs_dir))
    p = subprocess.Popen([*PATHPROF, "run", "--topology", "nic", "--duration", "20", "--probes", "off"], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert _wait_for(lambda: Path("/run/netns/pp-nic-srv").exists(), 30)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert "Traceback" not in err and "interrupted" in err
    assert machine_state() == before


def test_sigterm_mid_run_tears_down(runs_dir):
    before = machine_state()
    env = dict(os.environ, PATHPROF_RUNS=str(runs_dir))
    p = subprocess.Popen([*PATHPROF, "run", "--topology", "loopback", "--duration", "20", "--probes", "off"],
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert _wait_for(lambda: any(runs_dir.glob("*/pgbench/argv.txt")), 60)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130 and "Traceback" not in err, (p.returncode, err[-3000:])
    assert machine_state() == before
    meta = json.loads(next(runs_dir.glob("*/run.json")).read_text())
    assert meta["status"] == "interrupted"
