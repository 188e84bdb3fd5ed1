"""When the measurement windows open and close during a run, and what the run.json records about them.

The detailed probes are attached `window_s` seconds every `period_s` (pathprof.agent.probing.session explains why);
the windows are placed from the end of pgbench's start-up (its own setup connection closed; when a `ready` test is
given), over what is left of the run: the first at (period - window) / 2, so that even a run shorter
than one period gets a window away from pgbench's start-up and end, then one per period while a whole
window still fits before the end (minus a margin). A run too short for that gets one window in its middle,
shortened to the same duty (window/period of the run, at least MIN_WINDOW_S), so short runs are not
perturbed more than long ones.
"""
from __future__ import annotations

import threading
import time

# The default schedule: half of the run probed, half not (README "Default schedule" says why)
DEFAULT_WINDOW_S, DEFAULT_PERIOD_S = 2.0, 4.0
END_MARGIN_S = 0.5     # no window closes within this of pgbench's end (the last transactions drain)
MIN_WINDOW_S = 0.25     # shorter windows hold too few transactions (and /proc/stat ticks are 10 ms)
# the window's programs are attached this long before it opens: attaching takes 0.01-0.6 s beside a busy machine
# and once 2.26 s (CI, pgpool, 3-s run: the window opened after its planned end and held no transaction). The
# stretch between is an edge of the window (attached, not open), counted neither in nor out of it.
PREPARE_LEAD_S = 0.25
POLL_S = 0.1           # ring-buffer drain interval inside windows (--trace-sample)
READY_POLL_S = 0.01    # how often the load's start is looked for (`ready`)
READY_MAX_S, READY_MAX_SHARE = 30.0, 0.75   # and at most this long (or this share of the run): then the plan goes on
CALIBRATION_MAX_S = 0.5  # bpf_stats on at the start of each window for this long at most (agent.probing.cost)...
CALIBRATION_SHARE = 0.2  # ...and at most this share of the window
CALIBRATION_TRIES = 2    # slices a window begins when the cost module drops one (agent.probing.cost)


def calibration_s(window_s: float, duration_s: float | None) -> float:
    """Length of the calibration slice at the start of a window (always on: of the run)."""
    span = window_s if window_s > 0 else (duration_s or 10.0)
    return max(0.05, min(CALIBRATION_MAX_S, CALIBRATION_SHARE * span))


def always_on(window_s: float, period_s: float) -> bool:
    return window_s <= 0 or period_s <= window_s


def duty_pct(window_s: float, period_s: float) -> float:
    return 100.0 if always_on(window_s, period_s) else round(100.0 * window_s / period_s, 2)


def plan(duration_s: float | None, window_s: float, period_s: float, limit: int = 100000):
    """Window (start, end) offsets in seconds from pgbench's start; None = always on (one window, the run)."""
    if always_on(window_s, period_s):
        return None
    first = (period_s - window_s) / 2.0
    if not duration_s:                       # unknown length: keep going until stopped
        return ((first + k * period_s, first + k * period_s + window_s) for k in range(limit))
    out, t = [], first
    while t + window_s <= duration_s - END_MARGIN_S and len(out) < limit:
        out.append((t, t + window_s))
        t += period_s
    if not out:
        w = min(window_s, max(duration_s * window_s / period_s, MIN_WINDOW_S), duration_s / 2.0)
        s = max((duration_s - w) / 2.0, 0.0)
        out.append((s, s + w))
    return out


class _Background:
    """fn() in a thread of its own; join() waits for it and raises what it raised."""

    def __init__(self, fn):
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._call, args=(fn,), name="pp-window-attach", daemon=True)
        self._thread.start()

    def _call(self, fn) -> None:
        try:
            fn()
        except BaseException as exc:
            self.error = exc

    def wait(self) -> None:
        self._thread.join()

    def join(self) -> None:
        self.wait()
        if self.error is not None:
            raise self.error


class WindowRunner:
    """A thread that opens and closes the session's windows on the plan; stop() ends it (and the window)."""

    def __init__(self, session, window_s: float, period_s: float, duration_s: float | None, ready=None):
        self.session = session
        # ready(): the load's own start-up is over (pgbench's setup connection closed, its clients connecting):
        # the plan counts from then, and an always-on window opens then, so the start-up is no window's
        self.ready = ready
        self.window_s, self.period_s = window_s, period_s
        self.plan = plan(duration_s, window_s, period_s)
        self.duration_s = duration_s
        self.cal_s = calibration_s(window_s if self.plan is not None else 0, duration_s)
        # always on: calibrate once the run is past pgbench's start-up (connections, first plans)
        self.cal_at = 0.0 if self.plan is not None else min(2.0, 0.2 * (duration_s or 10.0))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def start(self) -> None:
        self.t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="pp-windows", daemon=True)
        self._thread.start()

    def _wait_until(self, t: float, poll: bool) -> bool:
        """Sleep until monotonic time t (draining spans when poll); False if stopped first."""
        while True:
            left = t - time.monotonic()
            if left <= 0:
                return True
            if self._stop.wait(min(left, POLL_S) if poll else left):
                return False
            if poll:
                self.session.poll()

    def _wait_ready(self) -> bool:
        """Wait (bounded) for ready(); the plan's origin moves to then. False if stopped first."""
        if self.ready is None:
            return True
        limit = self.t0 + min(READY_MAX_S, READY_MAX_SHARE * (self.duration_s or READY_MAX_S / READY_MAX_SHARE))
        while not self.ready():
            if time.monotonic() >= limit:
                self.session.notes.append(f"the load's start-up was not seen to end within {limit - self.t0:.1f} s:"
                                          " the measurement windows count from pgbench's start")
                return True
            if self._stop.wait(READY_POLL_S):
                return False
        now = time.monotonic()
        if self.plan is not None and self.duration_s:
            # the windows are placed over what is left of the run: a start-up that took most of it (a TCG guest,
            # 16 s to load the probes beside the other lane) had pushed a 6-s run's window past pgbench's end
            self.duration_s = max(self.duration_s - (now - self.t0), 2 * MIN_WINDOW_S)
            self.plan = plan(self.duration_s, self.window_s, self.period_s)
        self.t0 = now
        return True

    def _run(self) -> None:
        first = None
        try:
            # attached while the load starts up (beside the wait for its end), open once it has (always on) or at
            # the first window's time: its programs took 5.4 s to attach in a TCG guest beside the other lane, and
            # attached 0.25 s before its planned start that window opened after a 6-s run's end (CI, no
            # transaction in it). Until it opens the stretch is an edge, neither in nor out of a window; later
            # windows attach PREPARE_LEAD_S ahead
            first = _Background(self.session.prepare_window)
            if not self._wait_ready():
                return
            # always on: one window for the whole run, closed by stop()
            for s, e in (self.plan if self.plan is not None else [(0.0, float("inf"))]):
                if self.plan is not None and first is None:
                    if not self._wait_until(self.t0 + s - PREPARE_LEAD_S, poll=False):
                        return
                    self.session.prepare_window()
                if not self._wait_until(self.t0 + s, poll=False):
                    return
                if first is not None:
                    first.join()              # late when attaching took longer than the wait: _end keeps its length
                    first = None
                self.session.open_window()
                e = self._end(s, e, time.monotonic() - self.t0)
                if not self._wait_until(self.t0 + s + self.cal_at, poll=True):
                    return
                if not self._calibrate(self.t0 + e):
                    return
                if not self._wait_until(self.t0 + e, poll=True):
                    return                    # stop() closes the open window
                self.session.close_window()
        except BaseException as exc:          # a window that cannot open is a note, the run goes on
            self.error = exc
            self.session.notes.append(f"measurement window failed: {exc}")
        finally:
            if first is not None:             # stopped before the window: its attach is over before the run is
                first.wait()

    def _calibrate(self, window_end: float) -> bool:
        """A calibration slice of cal_s from when it begins (a window opened late had begun its slice after the
        slice's planned end: 1 ms long, CI of dd23880), another if the cost module dropped it and the window has
        room; False if stopped first."""
        for _ in range(CALIBRATION_TRIES):
            self.session.begin_calibration()
            if not self._wait_until(min(time.monotonic() + self.cal_s, window_end), poll=True):
                return False
            if self.session.end_calibration() is not False or time.monotonic() + self.cal_s > window_end:
                return True
        return True

    def _end(self, start: float, end: float, opened: float) -> float:
        """A window that opened late (its programs slow to attach) keeps its planned length as far as the run
        leaves room before its end margin: a late open must not leave a window without transactions."""
        late = opened - start
        if late <= 0 or not self.duration_s or end == float("inf"):
            return end
        return max(end, min(end + late, self.duration_s - END_MARGIN_S))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)


def window_meta(windows: list[dict], logs, window_s: float, period_s: float) -> dict:
    """run.json `probes` additions: the schedule, each window, and transactions/TPS in and out of them."""
    from pathprof.analysis.windows import split
    meta = {"schedule": {"window_s": window_s, "period_s": period_s, "duty_pct": duty_pct(window_s, period_s),
                         "always_on": always_on(window_s, period_s)},
            "windows": windows}
    if hasattr(logs, "split"):               # streamed already (agent.postgres.pgbench.log_stats)
        meta.update(logs.split())
    elif logs is not None and len(logs) and "epoch_s" in logs:
        ends = logs["epoch_s"].to_numpy(dtype="int64") * 1_000_000 + logs["epoch_us"].to_numpy(dtype="int64")
        meta.update(split(ends, logs["latency_us"].to_numpy(dtype="float64"), windows))
    meta.setdefault("in_windows", {})
    meta["in_windows"].update(cpu_in_windows(windows))
    return meta


def cpu_in_windows(windows: list[dict]) -> dict:
    """The machine's CPU time over the windows: busy_ns from the no-HZ idle time when every window was read
    that way (busy_source "nohz"), else the tick-sampled /proc/stat busy time of them all; busy_tick_ns and
    asleep_ns (the no-HZ sleep) alongside."""
    from pathprof.agent.probing.session import windows_asleep_ns
    asleep = windows_asleep_ns(windows)
    tick = sum(w.get("busy_tick_ns", w.get("busy_ns", 0)) for w in windows)
    out = {"busy_ns": sum(w.get("busy_ns", 0) for w in windows) if asleep is not None else tick,
           "busy_tick_ns": tick, "busy_source": "nohz" if asleep is not None else "tick",
           "elapsed_ns": sum(w.get("elapsed_ns", 0) for w in windows), "windows": len(windows)}
    if asleep is not None:
        out["asleep_ns"] = int(asleep)
    if windows and all("steal_ns" in w for w in windows):     # the hypervisor's steal (analysis.steal)
        out["steal_ns"] = sum(w["steal_ns"] for w in windows)
    return out

