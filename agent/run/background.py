"""Work that overlaps the run's critical path: a thread whose exception comes back to whoever waits for it."""
from __future__ import annotations

import sys
import threading
from contextlib import contextmanager


class Background:
    """fn(*args) on a thread of its own; join() waits and re-raises what it raised (once)."""

    def __init__(self, fn, *args):
        self._box: dict = {}
        # An Event, not Thread.join(): a join interrupted by Ctrl-C can make later joins return while the thread
        # still runs (CPython gh-90882), and teardown must not start removing what the thread is still making.
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._work, args=(fn, *args), name=f"pp-{fn.__name__}", daemon=True)
        self._thread.start()

    def _work(self, fn, *args) -> None:
        try:
            fn(*args)
        except BaseException as e:
            self._box["error"] = e
        finally:
            self._done.set()

    def join(self, quiet: bool = False) -> None:
        self._done.wait()
        error = self._box.pop("error", None)
        if error is not None and not quiet:
            raise error


@contextmanager
def in_background(fn, *args):
    """fn(*args) on a thread while the block runs; joined at the block's end, its exception re-raised there."""
    bg = Background(fn, *args)
    try:
        yield
    finally:
        bg.join(quiet=True) if sys.exc_info()[0] else bg.join()
