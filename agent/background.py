"""Work that overlaps the run's critical path: a thread whose exception comes back to whoever waits for it."""
from __future__ import annotations

import sys
import threading
from contextlib import contextmanager


class Background:
    """fn(*args) on a thread of its own; join() waits and re-raises what it raised (once)."""

    def __init__(self, fn, *args):
        self._box: dict = {}
        self._thread = threading.Thread(target=self._work, args=(fn, *args), name=f"pp-{fn.__name__}", daemon=True)
        self._thread.start()

    def _work(self, fn, *args) -> None:
        try:
            fn(*args)
        except BaseException as e:
            self._box["error"] = e

    def join(self, quiet: bool = False) -> None:
        self._thread.join()
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
