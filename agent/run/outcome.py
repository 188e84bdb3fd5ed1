"""How a run ended, in run.json `status`, whatever the way out: a run directory must never say "running" for a
run that is over (a report, `cleanup` and the user all read it)."""
from __future__ import annotations

from contextlib import contextmanager

from pathprof.analysis.rundir import RunDir
from pathprof.errors import Interrupted, UserError


@contextmanager
def recording(rd: RunDir, interrupted: str = "interrupted", cleanup=None):
    """`complete` when the block ends normally; `interrupted` on Ctrl-C or SIGTERM (re-raised as Interrupted
    with the message `interrupted`); `failed` with `error` (what the user is told) on anything else, re-raised.
    `cleanup()` (a built path's teardown) runs on every way out: after the status of a run that failed or was
    interrupted is written, before a complete one is called complete."""
    try:
        yield
    except KeyboardInterrupt:
        rd.update(status="interrupted")
        raise Interrupted(interrupted) from None
    except BaseException as e:
        rd.update(status="failed", error=error_text(e))
        raise
    finally:
        if cleanup is not None:
            cleanup()
    rd.update(status="complete")


def error_text(e: BaseException) -> str:
    """run.json `error`: a user error as the user is told it, anything else with its type (a bug)."""
    return str(e) if isinstance(e, UserError) else f"{type(e).__name__}: {e}"
