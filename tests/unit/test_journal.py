import os
import subprocess
import sys
import time

from pathprof.agent.host.journal import Journal, undo


def test_record_is_durable_before_creation_and_torn_lines_are_skipped(tmp_path):
    j = Journal("r1", tmp_path)
    j.record("note", text="a")
    j.record("dir", path=str(tmp_path / "x"))
    with open(j.path, "a") as f:
        f.write('{"kind": "note", "te')  # a writer killed mid-line
    loaded = Journal.load(j.path)
    assert [e["kind"] for e in loaded.entries] == ["owner", "note", "dir"]
    assert loaded.entries[0]["pid"] == os.getpid() and loaded.owner_alive()


def test_teardown_kills_only_the_recorded_process(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    j = Journal("r2", tmp_path)
    j.record_process(p.pid, ["sleep"])
    assert j.teardown() == []
    assert p.wait(timeout=5) is not None
    assert other.poll() is None
    other.kill()
    assert not j.path.exists()


def test_reused_pid_is_not_killed(tmp_path):
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    entry = {"kind": "process", "pid": other.pid, "start_time": 1}  # start time of some earlier process
    assert undo(entry) is True
    time.sleep(0.1)
    assert other.poll() is None
    other.kill()


def test_teardown_runs_newest_first(tmp_path, monkeypatch):
    order = []
    monkeypatch.setattr("pathprof.agent.host.journal.undo", lambda e: order.append(e["n"]) or True)
    j = Journal("r3", tmp_path)
    for n in range(3):
        j.record("note", n=n)
    j.teardown()
    assert order == [2, 1, 0]


def test_dir_removal_is_confined(tmp_path):
    assert undo({"kind": "dir", "path": "/etc"}) is False
