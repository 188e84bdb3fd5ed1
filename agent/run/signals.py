"""Ctrl-C and SIGTERM during a run: one teardown path for both, and no signal lost on the way."""
from __future__ import annotations

import logging  # noqa: F401  (imported first: its fork hooks must run inside ours, see _forking)
import os
import signal
from contextlib import contextmanager

from pathprof.agent.host import signal_zone

_interrupted = {"flag": False}
# Inside a fork's hooks (pyroute2's helpers fork; logging takes and releases its lock around each fork) Python
# swallows an exception and prints it as "Exception ignored ... Traceback": a Ctrl-C there only sets the flag, and
# the next checkpoint (each set-up phase; the pgbench loop polls `interrupted`) raises. Our hooks are registered
# after logging's, so ours run first before a fork and last after it.
_forking = {"depth": 0, "hooked": False}


def _hook_forks() -> None:
    if _forking["hooked"]:
        return
    _forking["hooked"] = True

    def before():
        _forking["depth"] += 1

    def after_in_parent():
        _forking["depth"] = max(0, _forking["depth"] - 1)

    def after_in_child():
        _forking["depth"] = 0
    os.register_at_fork(before=before, after_in_parent=after_in_parent, after_in_child=after_in_child)


def interrupted() -> bool:
    return _interrupted["flag"]


def checkpoint() -> None:
    """Raise at a safe point if a signal arrived while Python was swallowing exceptions (e.g. inside fork
    hooks, where a KeyboardInterrupt is only printed as 'Exception ignored')."""
    if _interrupted["flag"]:
        raise KeyboardInterrupt


@contextmanager
def sigterm_as_interrupt():
    """SIGTERM takes the same teardown path as Ctrl-C, and neither can be lost."""
    me = os.getpid()
    _interrupted["flag"] = False
    _hook_forks()

    def handler(signum, frame):
        if os.getpid() != me:  # a forked helper (pyroute2's) must not run the parent's teardown
            os._exit(1)
        _interrupted["flag"] = True
        if signal_zone.deferring():
            signal_zone.defer()
        elif not _forking["depth"]:
            raise KeyboardInterrupt
    old = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


@contextmanager
def uninterruptible():
    """Teardown must finish even if the user presses Ctrl-C again."""
    old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
    old_term = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)
