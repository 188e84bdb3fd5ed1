"""What the probes cost, measured in calibration slices.

The kernel's per-program statistics (bpf_stats: run_time_ns, run_cnt) add two clock reads to every run of
every BPF program on the machine while they are on -- on this project's VMs about as much as a small probe
costs itself. So they are on only for a calibration slice at the start of each measurement window
(pathprof.agent.probing.windows decides its length), and the cost over the whole measured interval is scaled
from the slices by the messages the probes counted (the `messages` stat: one per message delivered to a
tracked socket, so it follows the transactions, not the clock):

    run_time_ns = slice run time * (messages in all windows / messages in the slices)

Per program, run_cnt and run_time_ns are scaled the same way and ns/run is the slice's own figure.

A slice's two readings (the messages, then the programs' counters) are taken in the same order at each end, each
timed; a slice whose two spans differ (a reading held up at one end: its thread kept from the CPU), shorter than
the time to read it, or whose programs ran longer than its CPUs had time is not a measurement and is dropped
(`rejected`): a slice begun after its planned end lasted 1 ms by its clock, its counters held 5.3 M program runs
(seconds of them) against 634 messages, it scaled 871x, and its "probe" time took every process's CPU (CI of
dd23880, test_pgpool). Readings slow at both ends alike are kept (a TCG guest's take ~50 ms each).
"""
from __future__ import annotations

import os
import time

from pathprof.agent.probing import frames as F

SKEW_SHARE = 0.1       # the programs' counters and the messages may span lengths this far apart, at most
MIN_SLICE_S = 0.02     # a slice shorter than this is the time to read it, not a measurement
OVERRUN = 1.1          # a slice's programs may run this much more than its CPUs' time (clocks, rounding)


def _mid(a: int, b: int) -> int:
    return (a + b) // 2


class CostCalibration:
    def __init__(self):
        self._open = None
        self.reset()

    def reset(self) -> None:
        self.abort()
        self.progs: dict = {}          # summed over slices: {name: {run_time_ns, run_cnt, recursion_misses}}
        self.messages = 0              # messages counted inside the slices
        self.slices = 0
        self.slice_ns = 0
        self.rejected: list[str] = []  # slices dropped, and why
        self._open = None              # (stats fd, messages, programs' counters, when each was read)

    @staticmethod
    def _read(obj) -> tuple[int, dict, int, int]:
        """(messages, programs' counters, when each was read: the middle of its reading), in that order at both
        ends of a slice, so a reading as slow at both ends moves both spans alike (a TCG guest: ~50 ms each)."""
        t0 = time.monotonic_ns()
        msgs = F.read_stats(obj, only=("messages",)).get("messages", 0)
        t1 = time.monotonic_ns()
        progs = F.prog_stats((obj,))
        return msgs, progs, _mid(t0, t1), _mid(t1, time.monotonic_ns())

    def begin(self, obj) -> None:
        from pathprof.agent.probing.bpf.libbpf import enable_stats
        if self._open is not None:
            return
        try:
            fd = enable_stats()
        except OSError:
            return                     # no bpf_stats here: the cost stays unmeasured (reported as such)
        self._open = (fd, *self._read(obj))

    def end(self, obj) -> bool:
        """Close the open slice; False when it was dropped (see the module's note), True otherwise."""
        if self._open is None:
            return True
        fd, msgs0, progs0, tm0, tp0 = self._open
        msgs1, progs1, tm1, tp1 = self._read(obj)
        os.close(fd)
        self._open = None
        delta = F.sub_prog(progs1, progs0)
        span_m, span_p = tm1 - tm0, tp1 - tp0
        ran = sum(d.get("run_time_ns", 0) for d in delta.values())
        why = None
        if span_m < MIN_SLICE_S * 1e9:
            why = f"{span_m / 1e6:.1f} ms long"
        elif abs(span_p - span_m) > SKEW_SHARE * span_m:
            why = (f"its programs' counters spanned {span_p / 1e6:.1f} ms and its messages {span_m / 1e6:.1f} ms "
                   f"(a reading held up)")
        elif ran > OVERRUN * span_p * (os.cpu_count() or 1):
            why = f"its programs ran {ran / 1e6:.1f} ms in {span_p / 1e6:.1f} ms on {os.cpu_count()} CPUs"
        if why:
            self.rejected.append(why)
            return False
        for name, d in delta.items():
            acc = self.progs.setdefault(name, {"run_time_ns": 0, "run_cnt": 0, "recursion_misses": 0})
            for k in acc:
                acc[k] += d.get(k, 0)
        self.messages += msgs1 - msgs0
        self.slices += 1
        self.slice_ns += span_m
        return True

    def abort(self) -> None:
        if self._open is not None:
            os.close(self._open[0])
            self._open = None

    def estimate(self, messages_total: int, window_ns: int | None = None) -> dict:
        """The run.json `probes.cost` document: totals scaled to `messages_total`, per-program figures. With
        `window_ns` (the windows' length), never scaled beyond the windows' time over the slices': a slice that
        counted few of the run's messages while a neighbour's traffic ran the programs (they fire machine-wide)
        scaled 46.6x and its "probe" time took every process's CPU (CI 2026-11-27; the slice's rate, held for the
        windows, is the most the probes can have cost)."""
        scale = messages_total / self.messages if self.messages else 0.0
        if window_ns and self.slice_ns:
            scale = min(scale, max(1.0, window_ns / self.slice_ns))
        programs = {}
        for name, d in self.progs.items():
            if not d["run_cnt"]:
                continue
            programs[name] = {"run_time_ns": round(d["run_time_ns"] * scale), "run_cnt": round(d["run_cnt"] * scale),
                              "ns_per_run": round(d["run_time_ns"] / d["run_cnt"], 1),
                              "recursion_misses": d["recursion_misses"]}
        measured = bool(self.messages)
        return {"run_time_ns": sum(p["run_time_ns"] for p in programs.values()) if measured else None,
                "run_cnt": sum(p["run_cnt"] for p in programs.values()) if measured else None,
                "programs": programs,
                "calibration": {"method": "bpf_stats in calibration slices, scaled by messages",
                                "slices": self.slices, "slice_s": round(self.slice_ns / 1e9, 3),
                                "slice_messages": self.messages, "messages": messages_total,
                                "scale": round(scale, 3), "window_s": round(window_ns / 1e9, 3) if window_ns else None,
                                **({"rejected": self.rejected} if self.rejected else {})}}
