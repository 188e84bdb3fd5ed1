"""Faults mid-run: the server killed while pgbench runs. One clear message, a non-zero exit, a run directory
that says `failed` and what broke (and still reports), nothing left behind."""
import json
import os
import re
import signal
import subprocess
import time

import pytest
from conftest import PATHPROF, machine_state, run_pathprof

pytestmark = pytest.mark.integration


def _run_until_pgbench(runs_dir, *args, settle_s: float = 0.0) -> subprocess.Popen:
    """`pathprof run ARGS` in the background, returned once pgbench has started (plus settle_s)."""
    env = dict(os.environ, PATHPROF_RUNS=str(runs_dir))
    p = subprocess.Popen([*PATHPROF, "run", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    deadline = time.time() + 60
    while time.time() < deadline and not any(runs_dir.glob("*/pgbench/argv.txt")):
        time.sleep(0.2)
    time.sleep(settle_s)
    return p


def _error_line(err: str) -> str:
    return [x for x in err.splitlines() if x.startswith("pathprof: error:")][-1]


def _postmasters(state_prefix: str) -> list[int]:
    out = subprocess.run(["pgrep", "-f", f"postgres -D {state_prefix}"], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def test_postmaster_killed_mid_run_is_reported_as_a_broken_run(runs_dir):
    before = machine_state()
    p = _run_until_pgbench(runs_dir, "--topology", "unix", "--clients", "2", "--duration", "6", "--probes", "basic",
                           "--no-live", settle_s=1.5)
    (run_id,) = _run_ids_of(runs_dir)                 # this run's postmaster only: the machine is shared
    pids = _postmasters(f"/var/lib/pathprof/state/{run_id}/")
    assert pids, "no postmaster found"
    os.kill(min(pids), signal.SIGKILL)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 2, (p.returncode, err[-2000:])
    line = _error_line(err)
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
    p = _run_until_pgbench(runs_dir, "--topology", "pgbouncer", "--clients", "2", "--duration", "6", "--probes",
                           "off", "--no-live", settle_s=1.5)
    (run_id,) = _run_ids_of(runs_dir)                 # this run's pgbouncer only: the machine is shared
    pids = [int(x) for x in subprocess.run(["pgrep", "-f", f"pgbouncer /var/lib/pathprof/state/{run_id}/"],
                                           capture_output=True, text=True).stdout.split()]
    assert pids, "no pgbouncer found"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 2, (p.returncode, err[-2000:])
    line = _error_line(err)
    assert "pgbouncer" in line and "broke" in line and "Traceback" not in err
    assert machine_state() == before
    (rd,) = list(runs_dir.iterdir())
    assert json.loads((rd / "run.json").read_text())["status"] == "failed"


def test_full_runs_directory_fails_cleanly(tmp_path):
    """The runs directory's disk fills up during the run: one clear line, exit 2, the path torn down."""
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(tiny)], check=True)
    try:
        before = machine_state()
        cp = run_pathprof("run", "--topology", "loopback", "--clients", "2", "--duration", "2", "--runs-dir",
                          str(tiny), timeout=300)
        assert cp.returncode == 2, cp.stderr[-2000:]
        assert "No space left on device" in cp.stderr and "Traceback" not in cp.stderr
        assert machine_state() == before
    finally:
        subprocess.run(["umount", "-l", str(tiny)])


def test_a_second_run_of_the_same_path_is_refused_and_the_first_is_untouched(runs_dir):
    before = machine_state()
    first = _run_until_pgbench(runs_dir / "first", "--topology", "nic", "--clients", "2", "--duration", "2",
                               "--probes", "off", "--json", "--no-live")
    t0 = time.time()
    second = run_pathprof("run", "--topology", "nic", "--clients", "2", "--duration", "5", "--probes", "off",
                          runs_dir=runs_dir / "second", timeout=120)
    assert second.returncode == 2 and "already exists" in second.stderr and "Traceback" not in second.stderr
    assert time.time() - t0 < 20                          # refused at once, not after waiting for the first
    out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err[-2000:]
    doc = json.loads(out)
    assert doc["status"] == "complete" and doc["tps"] > 0 and doc["transactions"] > 0
    assert machine_state() == before


def test_link_down_mid_run_names_the_link(runs_dir):
    """The wire between client and server host goes down: pgbench cannot finish; after pathprof's bounded wait
    the one error line names the link, and everything is torn down."""
    before = machine_state()
    p = _run_until_pgbench(runs_dir, "--topology", "nic", "--clients", "1", "--duration", "2", "--probes", "off",
                           "--no-live", settle_s=1)
    subprocess.run(["ip", "-n", "pp-nic-srv", "link", "set", "pp-nic-s", "down"], check=True)
    _, err = p.communicate(timeout=180)
    assert p.returncode == 2, (p.returncode, err[-2000:])
    line = _error_line(err)
    assert "link pp-nic-s in pp-nic-srv is down" in line and "Traceback" not in err, line
    assert machine_state() == before


def _run_ids_of(runs_dir) -> list[str]:
    return [json.loads((d / "run.json").read_text())["run_id"] for d in runs_dir.iterdir() if (d / "run.json").exists()]


def _netns_processes(prefix: str) -> dict[int, int]:
    """pid -> start time of every process inside the namespaces named prefix*."""
    from pathprof.agent.host.proc import pid_start_time
    out = {}
    for ns in [line.split()[0] for line in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                                          text=True).stdout.splitlines() if line.strip()]:
        if ns.startswith(prefix):
            for tok in subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split():
                out[int(tok)] = pid_start_time(int(tok))
    return out


def _pp_objects(prefix: str) -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout + \
        subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return sorted(set(re.findall(re.escape(prefix) + r"[\w-]*", out)))


@pytest.mark.parametrize("removing_path", [False, True], ids=["stopping-services", "replaying-journal"])
def test_sigkill_during_teardown_then_cleanup_restores_the_machine(runs_dir, removing_path):
    """pathprof killed with SIGKILL while it tears down (probes attached, pgbouncer and postgres running in four
    namespaces; killed as teardown starts, or once it is removing the path): `pathprof cleanup` replays its
    journal, marks the run directory `killed`, and the machine is as before: namespaces, links, iptables,
    processes, BPF programs/links/pins."""
    from pathprof.agent.host.journal import JOURNAL_DIR, Journal
    from pathprof.agent.host.proc import pid_alive, pid_start_time
    before = machine_state()
    env = dict(os.environ, PATHPROF_RUNS=str(runs_dir))
    p = subprocess.Popen([*PATHPROF, "run", "--topology", "pgbouncer-3host", "--clients", "2", "--duration", "2",
                          "--probe-duty", "100", "--no-live"], env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    procs, lines = {}, []
    for line in p.stderr:
        lines.append(line)
        if "pgbench:" in line and not procs:
            procs = _netns_processes("pp-pb3-")       # postgres, its backends and pgbouncer
        if "tearing down" in line and procs:
            if removing_path:             # its servers are gone, its namespaces not yet: the journal is replaying
                deadline = time.monotonic() + 10
                # gone = exited: a zombie that pathprof reaps only later is gone already (pid_alive)
                while time.monotonic() < deadline and any(pid_start_time(pid) == st and pid_alive(pid)
                                                          for pid, st in procs.items()):
                    time.sleep(0.002)
            p.send_signal(signal.SIGKILL)
            break
    p.wait(timeout=30)
    (run_id,) = _run_ids_of(runs_dir)
    journal = JOURNAL_DIR / f"{run_id}.jsonl"
    try:
        assert procs, "the run did not get to pgbench:\n" + "".join(lines)[-2000:]
        assert p.returncode == -signal.SIGKILL
        assert journal.exists(), "teardown finished before the kill: the test proved nothing"
        cp = run_pathprof("cleanup", timeout=120)
        assert cp.returncode == 0, cp.stdout + cp.stderr
        assert f"journal {run_id}: remove netns pp-pb3-db" in cp.stdout
        assert not journal.exists()
        assert machine_state() == before
        assert not _pp_objects("pp-pb3-")            # hidden from machine_state by PATHPROF_TEST_IGNORE
        # a zombie (exited, waiting for PID 1 to reap it) is not alive: it holds nothing (#19)
        alive = [pid for pid, st in procs.items() if st is not None and pid_start_time(pid) == st and pid_alive(pid)]
        assert not alive, f"processes of the killed run still alive: {alive}"
        (rd,) = list(runs_dir.iterdir())
        meta = json.loads((rd / "run.json").read_text())
        assert meta["status"] == "killed" and "killed" in meta["failure"][-1]
    finally:
        if journal.exists():                          # a failed assertion must not strand the path
            Journal.load(journal).teardown()


def test_cleanup_during_a_live_run_leaves_it_alone(runs_dir):
    """Several people share a machine: `pathprof cleanup` while a run is going on must leave that run's journal
    and objects alone, and the run completes as if nothing happened."""
    before = machine_state()
    p = _run_until_pgbench(runs_dir, "--topology", "docker-bridge", "--clients", "2", "--duration", "3",
                           "--probes", "basic", "--status-every", "1", "--json", "--no-live", settle_s=0.5)
    (run_id,) = _run_ids_of(runs_dir)
    cp = run_pathprof("cleanup", timeout=120)
    assert f"left alone: run {run_id} is live" in cp.stdout, cp.stdout
    assert not any(run_id in line or "pp-dk-" in line for line in cp.stdout.splitlines()
                   if not line.startswith("left")), cp.stdout
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err[-2000:]
    doc = json.loads(out)
    assert doc["status"] == "complete" and doc["transactions"] > 0 and doc["stages"]
    assert machine_state() == before
    # the status file it kept while pgbench ran: its own memory, its maps, its events
    status = json.loads((runs_dir / doc["run_dir"].split("/")[-1] / "status.json").read_text())
    maps = {m["name"]: m for m in status["maps"]}
    assert status["agent_rss_kb"] > 10_000 and status["events"]["messages"] > 0
    assert maps["tasks"]["entries"] >= 3 and maps["socks"]["entries"] >= 2     # pgbench, 2 backends; 2 + 2 sockets
    assert 0 <= maps["stages"]["entries"] <= maps["stages"]["max_entries"]
