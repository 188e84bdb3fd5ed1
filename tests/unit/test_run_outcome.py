"""Every way a run ends is written into run.json: complete, interrupted, or failed with the error; a run that
died never stays `status: "running"`. And attach's second look at the clients invents nothing when it fails."""
import json

import pytest
from pathprof.agent.discovery.chain import DiscoveredPath
from pathprof.agent.run import attach
from pathprof.agent.run.options import Reporter
from pathprof.agent.run.outcome import recording
from pathprof.analysis.rundir import RunDir
from pathprof.errors import Interrupted, UserError


def status(rd: RunDir) -> dict:
    return json.loads(rd.file("run.json").read_text())


def test_each_exit_is_recorded(tmp_path):
    ok = RunDir.create(tmp_path, "t")
    with recording(ok):
        ok.update(status="running")
    assert status(ok)["status"] == "complete" and "error" not in status(ok)

    bug = RunDir.create(tmp_path, "t")
    with pytest.raises(ZeroDivisionError), recording(bug):
        1 / 0
    assert (status(bug)["status"], status(bug)["error"]) == ("failed", "ZeroDivisionError: division by zero")

    user = RunDir.create(tmp_path, "t")
    with pytest.raises(UserError), recording(user):
        raise UserError("pgbench failed (exit 1): no such table")
    assert (status(user)["status"], status(user)["error"]) == ("failed", "pgbench failed (exit 1): no such table")

    stopped = RunDir.create(tmp_path, "t")
    with pytest.raises(Interrupted), recording(stopped):
        raise KeyboardInterrupt
    assert status(stopped)["status"] == "interrupted"


def test_attach_whose_probes_fail_records_failed(tmp_path, monkeypatch):
    """An error after the run directory exists (here the probes refusing to load) ends as failed, not running."""
    from pathprof.agent.discovery.sockets import SocketTable
    from pathprof.agent.probing import doctor
    from pathprof.agent.probing.session import ProbeSession
    path = DiscoveredPath(postmaster=None, client_connections=1)
    monkeypatch.setattr(attach, "resolve", lambda opts: (SocketTable.take(), path))
    monkeypatch.setattr(doctor, "require", lambda level: None)

    def refuse(self):
        raise OSError(1, "loading pathprof.bpf.o failed")
    monkeypatch.setattr(ProbeSession, "start", refuse)
    with pytest.raises(OSError):
        attach.execute_attach(attach.AttachOptions(port=1, duration_s=1, runs_dir=tmp_path), Reporter())
    (run,) = tmp_path.iterdir()
    doc = json.loads((run / "run.json").read_text())
    assert doc["status"] == "failed" and "loading pathprof.bpf.o failed" in doc["error"], doc.get("error")


def test_a_failed_second_look_at_the_clients_is_not_a_closed_note():
    """The path's entry is gone (no such process): whether clients left is unknown, and the note says so."""
    path = DiscoveredPath(postmaster=2**22 + 12345, postgres_listen=["127.0.0.1:1"], client_connections=4)
    note = attach.clients_left_note(attach.AttachOptions(port=1), path)
    assert note is not None and "closed" not in note and "unknown" in note, note


def test_agents_started_in_one_second_get_a_directory_each(tmp_path):
    """One agent per host, started together into one runs directory, name their runs alike (the second and the
    kind): each claims its own directory by creating it (it was a look, then a create: the loser failed)."""
    import threading
    barrier, made, errors = threading.Barrier(8), [], []

    def create():
        barrier.wait()
        try:
            made.append(RunDir.create(tmp_path / "runs", "attach", run_id="20261125-184718-attach").path)
        except Exception as e:       # noqa: BLE001 -- the race's loser, before
            errors.append(e)
    threads = [threading.Thread(target=create) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(made)) == 8, (errors, made)
    assert all((p / "run.json").is_file() and (p / "pgbench").is_dir() for p in made)
