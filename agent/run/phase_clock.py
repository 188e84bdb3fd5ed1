"""Where a run's wall-clock time goes outside pgbench: seconds per phase, recorded in run.json as `setup_s`."""
from __future__ import annotations

import os
import time
from contextlib import contextmanager


def seconds_since_process_start() -> float | None:
    """How long this process has existed (Python start-up and imports included), from /proc."""
    try:
        start_ticks = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])
        uptime = float(open("/proc/uptime").read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))


class PhaseClock:
    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.t0 = time.monotonic()
        started = seconds_since_process_start()
        if started is not None:
            self.seconds["startup"] = round(started, 3)   # the interpreter and the CLI, before the run began

    @contextmanager
    def phase(self, name: str):
        t = time.monotonic()
        try:
            yield
        finally:
            self.add(name, time.monotonic() - t)

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = round(self.seconds.get(name, 0.0) + seconds, 3)

    def total(self) -> dict[str, float]:
        """The phases, plus `total` (start-up through now)."""
        return {**self.seconds, "total": round(time.monotonic() - self.t0 + self.seconds.get("startup", 0.0), 3)}
