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
    assert p.wait(timeout=5) is not None  # TimeoutExpired while it lives
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
    monkeypatch.setattr("pathprof.agent.host.journal.undo", lambda e, **kw: order.append(e["n"]) or True)
    j = Journal("r3", tmp_path)
    for n in range(3):
        j.record("note", n=n)
    j.teardown()
    assert order == [2, 1, 0]


def test_dir_removal_is_confined(tmp_path):
    assert undo({"kind": "dir", "path": "/etc"}) is False


SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_a_process_is_journaled_before_it_is_spawned(tmp_path, monkeypatch):
    """A crash between the spawn and the pid's record (here: reading its start time fails) leaves the intent
    in the journal; the replay finds the process by the mark it was started with and kills it."""
    from pathprof.agent.host import journal as journal_mod
    from pathprof.agent.host import proc
    from pathprof.topologies.builder import BuildContext, HostInfo
    j = Journal("r5", tmp_path)
    ctx = BuildContext(topology=None, journal=j, state_dir=tmp_path, hosts={"h": HostInfo("h", None)})

    own_start = journal_mod.pid_start_time

    def crash(pid):
        if pid == os.getpid():
            return own_start(pid)                      # the journal's owner line
        raise RuntimeError("killed between the spawn and the pid's record")
    monkeypatch.setattr(journal_mod, "pid_start_time", crash)
    started = []
    real_spawn = proc.spawn
    monkeypatch.setattr(proc, "spawn", lambda *a, **kw: started.append(real_spawn(*a, **kw)) or started[-1])
    try:
        ctx.spawn("h", SLEEPER)
    except RuntimeError:
        pass
    monkeypatch.undo()
    assert len(started) == 1 and started[0].poll() is None
    assert Journal.load(j.path).teardown() == []           # `pathprof cleanup` after the crash
    try:
        assert started[0].wait(timeout=10) is not None  # TimeoutExpired while it lives
    finally:
        started[0].kill()


def test_a_process_whose_namespace_name_is_gone_is_still_killed(tmp_path):
    """`ip netns del` removes the name, not the processes inside (they keep the namespace alive): the
    replay must still kill a journaled process whose namespace name no longer exists."""
    p = subprocess.Popen(SLEEPER, start_new_session=True)
    j = Journal("r6", tmp_path)
    j.record_process(p.pid, SLEEPER, netns="pp-correct-gone-ns")
    assert j.teardown() == []
    try:
        assert p.wait(timeout=10) is not None  # TimeoutExpired while it lives
    finally:
        p.kill()


def test_a_recorded_spawn_is_replayed_without_waiting_for_a_late_exec(tmp_path, monkeypatch):
    """The intent of a spawn whose pid was recorded is undone by its mark at once: the look-again for a process
    still in its exec (~0.3 s per intent, paid by every run's teardown) is only for an intent left alone."""
    def no_settle(*a, **kw):
        raise AssertionError("waited for a late exec of a recorded spawn")
    monkeypatch.setattr("pathprof.agent.host.journal._marked_settled", no_settle)
    j = Journal("r9", tmp_path)
    p = j.spawn(None, SLEEPER)
    assert j.teardown() == []
    assert p.wait(timeout=5) is not None
