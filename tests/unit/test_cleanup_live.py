"""`pathprof cleanup` on a shared machine: a live run's journal and every object it names are left alone, also
when a dead run's journal names the same objects (a new run of the same path); dead runs' objects go."""
import json
import os
import subprocess
import sys
import time

import pytest
from pathprof.agent.host import cleanup, journal
from pathprof.agent.host.journal import Journal


@pytest.fixture
def jdir(tmp_path, monkeypatch):
    """A journal directory of its own, and a machine whose pp- objects are the ones the journals name (the
    real machine's, other engineers' runs among them, stay out of the test)."""
    monkeypatch.setattr(journal, "JOURNAL_DIR", tmp_path)
    monkeypatch.setattr(cleanup, "leftover_namespaces", lambda: ["pp-nic-srv"])
    monkeypatch.setattr(cleanup, "leftover_links", lambda: [])
    monkeypatch.setattr(cleanup, "leftover_rules", lambda: [])
    monkeypatch.setattr(cleanup, "leftover_chains", lambda: [])
    monkeypatch.setattr("pathprof.agent.host.io_limit.leftover_cgroups", lambda: [])
    return tmp_path


def _dead_journal(jdir, run_id, *entries):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    with open(jdir / f"{run_id}.jsonl", "w") as f:
        f.write(json.dumps({"kind": "owner", "pid": gone.pid, "start_time": 1}) + "\n")
        for e in entries:
            f.write(json.dumps(e) + "\n")


def test_live_run_is_left_alone_and_dead_runs_are_replayed(jdir):
    live = Journal("20261123-live-nic", jdir)           # owned by this (alive) process
    live.record("netns", name="pp-nic-srv")
    live.record("iptables", table="nat", chain="PP-DOCKER", args=["-j", "RETURN"], netns="pp-nic-srv")
    live.record("sysctl", name="net.ipv4.ip_forward", old="1", netns=None)
    _dead_journal(jdir, "20261123-dead-nic", {"kind": "netns", "name": "pp-nic-srv"},
                  {"kind": "sysctl", "name": "net.ipv4.ip_forward", "old": "0", "netns": None},
                  {"kind": "link", "name": "pp-nic-c", "netns": "pp-nic-srv"},
                  {"kind": "netns", "name": "pp-gone-cli"})
    report = cleanup.cleanup_all(dry_run=True)
    assert "journal 20261123-dead-nic: remove netns pp-gone-cli" in report["actions"]
    assert not any("pp-nic-srv" in a or "pp-nic-c" in a for a in report["actions"]), report["actions"]
    assert any(k.startswith("left alone: run 20261123-live-nic is live") for k in report["kept"])
    assert any("left netns pp-nic-srv" in k for k in report["kept"])
    assert any("left sysctl net.ipv4.ip_forward" in k for k in report["kept"])
    assert live.path.exists()


def test_dead_run_replay_skips_a_live_runs_objects(jdir, monkeypatch):
    live = Journal("live", jdir)
    live.record("link", name="pp-lo-a")
    _dead_journal(jdir, "dead", {"kind": "link", "name": "pp-lo-a"}, {"kind": "note", "text": "x"})
    undone = []
    monkeypatch.setattr(journal, "undo", lambda e, **kw: undone.append(e) or True)
    monkeypatch.setattr(cleanup, "leftover_namespaces", lambda: [])
    monkeypatch.setattr(cleanup, "leftover_links", lambda: ["pp-lo-a", "pp-stray"])
    report = cleanup.cleanup_all(dry_run=True)
    assert report["actions"][-1] == "remove link pp-stray" and "remove link pp-lo-a" not in report["actions"]
    monkeypatch.setattr(cleanup.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0))
    cleanup.cleanup_all(dry_run=False)
    assert [e["kind"] for e in undone] == ["note", "owner"]  # the link entry was skipped
    assert live.path.exists() and not (jdir / "dead.jsonl").exists()


def test_topology_up_journal_is_kept(jdir):
    _dead_journal(jdir, "topology-nic", {"kind": "netns", "name": "pp-nic-cli"})
    report = cleanup.cleanup_all(dry_run=True)
    assert not any("pp-nic-cli" in a for a in report["actions"])
    assert any("topology nic is up" in k for k in report["kept"])


def test_names_in_finds_names_in_any_entry_shape():
    entry = {"kind": "iptables_batch", "netns": "pp-a", "chains": [["nat", "PP-DOCKER"]], "rules": [{"x": "pp-b"}],
             "path": "/sys/fs/cgroup/blkio/pp-c", "dir": "/var/lib/pathprof/state/x"}
    assert cleanup.names_in(entry) == {"pp-a", "PP-DOCKER", "pp-b", "pp-c"}


def test_journal_of_an_older_pathprof_without_owner(jdir):
    """Written before owner lines: fresh and without processes = still building (kept); old = dead."""
    path = jdir / "legacy.jsonl"
    path.write_text(json.dumps({"kind": "netns", "name": "pp-legacy"}) + "\n")
    assert any("being set up" in k for k in cleanup.cleanup_all(dry_run=True)["kept"])
    os.utime(path, (time.time() - 3600, time.time() - 3600))
    assert "journal legacy: remove netns pp-legacy" in cleanup.cleanup_all(dry_run=True)["actions"]


def test_a_zombie_owner_is_a_dead_owner():
    """A process that exited and was not reaped (state Z) is not alive: its journal is cleanable (issue #19)."""
    import os
    import time

    from pathprof.agent.host.proc import pid_alive
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    try:
        for _ in range(200):                     # until the child has exited (it is not reaped: a zombie)
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            time.sleep(0.01)
        assert os.path.exists(f"/proc/{pid}") and not pid_alive(pid)
        assert pid_alive(os.getpid())
    finally:
        os.waitpid(pid, 0)
    assert not pid_alive(pid)
