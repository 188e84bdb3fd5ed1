"""--start-at: one wall-clock time given to every host's agent, so that they record the same interval (what
`pathprof merge` needs). attach begins its interval then; `run --dsn` starts pgbench then. Both wait with their
probes loaded and attached, so the time spent loading them (seconds on a busy machine) is outside the interval."""
from __future__ import annotations

import time

from pathprof.errors import UserError

HORIZON_S = 3600.0      # a time further ahead is a mistake (a millisecond value, a date), not a plan


def check(start_at: float | None) -> None:
    """Refuse a time that is not within the last minute or the next hour, in one line."""
    if start_at is not None and not -60 < start_at - time.time() <= HORIZON_S:
        raise UserError(f"--start-at {start_at:.3f} is {start_at - time.time():+.0f} s from now: give a "
                        "wall-clock time (seconds since the epoch) within the next hour")


def wait(start_at: float | None, ui) -> float | None:
    """Sleep until start_at; how late the caller was when it came after it (it then begins at once), else None."""
    if start_at is None:
        return None
    left = start_at - time.time()
    if left <= 0:
        ui.note(f"--start-at was {-left:.3f} s ago when the probes were ready: the interval begins now")
        return round(-left, 3)
    ui.phase(f"waiting {left:.1f} s for --start-at")
    time.sleep(left)
    return None


def late_note(late: float | None) -> str | None:
    if not late:
        return None
    return (f"--start-at: the probes were ready {late:.3f} s after the time given; the interval began then, later "
            "than the other hosts' agents given the same time")
