"""Ctrl-C and SIGTERM during a run: one teardown path for both, and no signal lost on the way."""
from __future__ import annotations

import os
import signal
from contextlib import contextmanager

_interrupted = {"flag": False}


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

    def handler(signum, frame):
        if os.getpid() != me:  # a forked helper (pyroute2's) must not run the parent's teardown
            os._exit(1)
        _interrupted["flag"] = True
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
