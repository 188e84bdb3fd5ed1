"""A Ctrl-C that lands inside a fork's hooks (pyroute2 forks helpers during set-up; logging takes and releases its
lock around each fork) is not lost and prints no "Exception ignored ... Traceback": it sets the flag, and the next
checkpoint raises (pathprof.agent.run.signals)."""
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from pathprof.agent.run import signals


def test_a_signal_inside_a_real_fork_is_deferred_to_the_next_checkpoint():
    # a hook registered before pathprof's runs inside its window (after a fork: in registration order), and sends
    # the signal there, as a Ctrl-C arriving during logging's _releaseLock would
    code = textwrap.dedent("""
        import os, signal
        os.register_at_fork(after_in_parent=lambda: os.kill(os.getpid(), signal.SIGINT))
        from pathprof.agent.run.signals import sigterm_as_interrupt, checkpoint, interrupted
        with sigterm_as_interrupt():
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            os.waitpid(pid, 0)
            for _ in range(1000):      # bytecodes: the handler has run by now
                pass
            print("flag", interrupted())
            try:
                checkpoint()
            except KeyboardInterrupt:
                print("raised at the checkpoint")
    """)
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    assert "flag True" in cp.stdout and "raised at the checkpoint" in cp.stdout, cp.stdout
    assert "Traceback" not in cp.stderr and "Exception ignored" not in cp.stderr, cp.stderr


def test_outside_a_fork_the_signal_raises_at_once():
    with signals.sigterm_as_interrupt():
        assert signals._forking["depth"] == 0
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):
                pass
        assert signals.interrupted()
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    assert signals._forking["depth"] == 0      # every fork's window closed again
