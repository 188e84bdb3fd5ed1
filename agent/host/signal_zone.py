"""Stretches where a Ctrl-C must not raise at once. pyroute2 runs an asyncio loop under its blocking API: a
KeyboardInterrupt raised by the run's handler inside it leaves coroutines half-closed, and Python prints their
tracebacks at exit ("an error occurred during closing of asynchronous generator", CI 2026-11-26) although the run
tore down cleanly. Inside `deferred_signals()` the handler (agent.run.signals) only notes the signal; the
outermost block raises it once the library is out of the way."""
from __future__ import annotations

from contextlib import contextmanager

_zone = {"depth": 0, "pending": False}


def deferring() -> bool:
    return _zone["depth"] > 0


def defer() -> None:
    """Called by the signal handler inside a zone: raise at its end instead."""
    _zone["pending"] = True


@contextmanager
def deferred_signals():
    _zone["depth"] += 1
    try:
        yield
    finally:
        _zone["depth"] -= 1
    if not _zone["depth"] and _zone["pending"]:
        _zone["pending"] = False
        raise KeyboardInterrupt
