"""pgbench is held at a gate until the probes follow its pid (agent.postgres.pgbench.GATE): a real `sh` in front
of a command that leaves a mark when it runs."""
import subprocess
import time
from pathlib import Path

import pytest
from pathprof.agent.postgres import pgbench


def _spawn(mark: Path) -> subprocess.Popen:
    return subprocess.Popen([*pgbench.GATE, "sh", "-c", f"echo ran > {mark}; cat"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)


def test_the_command_runs_only_once_on_start_has_returned_with_the_same_pid(tmp_path):
    mark, seen = tmp_path / "mark", {}

    def on_start(pid):
        time.sleep(0.3)                                  # long enough for an ungated command to have run
        seen["ran_before"] = mark.exists()
        seen["pid"] = pid
    p = _spawn(mark)
    pgbench._through_gate(p, on_start)
    assert p.wait(timeout=10) == 0                       # `cat` read /dev/null, not the gate's pipe: it ended
    assert seen == {"ran_before": False, "pid": p.pid} and mark.read_text() == "ran\n"


def test_a_failed_on_start_never_starts_the_command(tmp_path):
    mark = tmp_path / "mark"

    def on_start(pid):
        raise RuntimeError("probes failed")
    p = _spawn(mark)
    with pytest.raises(RuntimeError):
        pgbench._through_gate(p, on_start)
    assert p.returncode is not None and p.returncode != 0 and not mark.exists()


def test_an_interruption_after_the_gate_opened_is_raised_not_a_timeout(tmp_path, monkeypatch):
    """SIGTERM between the gate's write and its `opened` flag (CI ci44b): the command is running, the wait for it
    times out, and that timeout must not replace the interruption (pathprof then printed a traceback, exit 1)."""
    p = subprocess.Popen([*pgbench.GATE, "sleep", "30"], stdin=subprocess.PIPE, text=True)
    real_wait = p.wait

    class Interrupted(BaseException):
        pass

    class Stdin:                         # the write goes through, then the signal's exception comes
        def write(self, text):
            p_stdin.write(text)
            p_stdin.flush()
            raise Interrupted

        def close(self):
            p_stdin.close()
    p_stdin, p.stdin = p.stdin, Stdin()
    monkeypatch.setattr(p, "wait", lambda timeout=None: real_wait(timeout=min(timeout or 1, 0.5)))
    try:
        with pytest.raises(Interrupted):
            pgbench._through_gate(p, lambda pid: None)
        assert p.poll() is None                      # the command did start: the caller stops it
    finally:
        p.kill()
        real_wait()
