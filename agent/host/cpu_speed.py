"""How fast this machine's CPU runs right now: a few milliseconds of fixed work, timed, best of several tries.

A virtual machine's CPU is not a constant: the host's other tenants, its frequency and its caches make the same
work take 15-30 % longer for tens of seconds at a time (a 16-client loopback run here gave 104,682 then 75,796 TPS
two minutes apart, every component's CPU per transaction larger by one ratio). One run cannot tell that from its
path; two runs compared (`predict` against the run it predicts, `compare`, `diff`) can, when each recorded the
machine's speed beside it (read by analysis.speed.sampled_ratio). Sampled just before the load starts and just
after it stops (the CPUs otherwise idle), single-threaded; the best of several tries drops a try a preemption or
steal cut into.

Three kinds of work, each in ns per unit (lower is faster), because a machine slows in more than one way:
  interp   Python bytecode (branches, small objects: an interpreter's speed, like a backend's executor)
  hash     blake2b over a buffer that fits the L2 cache (the core's own arithmetic and frequency)
  memory   one byte from every cache line of a buffer four times the L2 cache of the machines here (the shared
           last-level cache and memory: what noisy neighbours take)
"""
from __future__ import annotations

import hashlib
import math
import statistics
import time

TRIES = 5
_HASH_BUF = bytes(range(256)) * 1024            # 256 KiB
_MEM_BYTES = 16 * 1024 * 1024                   # allocated for a sample only, and written (untouched pages all
                                                # read one shared zero page)
_LINE = 64


def _interp(n: int = 40_000) -> int:
    acc, d = 0, {}
    for i in range(n):
        acc = (acc * 31 + i) & 0xFFFF
        d[acc & 63] = i
    return n


def _hash() -> int:
    hashlib.blake2b(_HASH_BUF).digest()
    return len(_HASH_BUF) // 1024               # units: KiB hashed


def _memory(buf: bytearray) -> int:
    lines = buf[::_LINE]                        # touches every cache line once
    return len(lines) // 1024                   # units: 1,024 lines


KINDS = ("interp", "hash", "memory")          # each the best try; interp_median beside them


def _ns_per_unit(work, tries: int) -> list[float]:
    out = []
    for _ in range(tries):
        t = time.perf_counter_ns()
        units = work()
        out.append((time.perf_counter_ns() - t) / units)
    return sorted(out)


def sample(tries: int = TRIES) -> dict:
    """{kind: ns per unit} for every kind, the best of `tries` each (~40 ms in all on this VM), `interp_median`
    (the median try of interp: a hypervisor that time-slices the CPU slows some tries, not the best one), and `at`
    (CLOCK_MONOTONIC seconds)."""
    buf = bytearray(b"\x01") * _MEM_BYTES
    work = {"interp": _interp, "hash": _hash, "memory": lambda: _memory(buf)}
    out = {}
    for kind in KINDS:
        tries_ns = _ns_per_unit(work[kind], tries)
        out[kind] = round(tries_ns[0], 2)
        if kind == "interp":
            out["interp_median"] = round(statistics.median(tries_ns), 2)
    out["at"] = round(time.monotonic(), 3)
    return out


_WATCH_BUF = bytes(range(256)) * 256             # 64 KiB: ~0.12 ms of hashing a try here
WATCH_PERIOD_S = 0.25


class SpeedWatch:
    """The speed of each CPU while the load runs, for the run's whole length: every WATCH_PERIOD_S, on each CPU in
    turn (the thread pinned to it), the best of three blake2b hashes of 64 KiB. Why not one sample before and one
    after: on this VM each vCPU flips between two speeds ~1.7x apart every few seconds (its host core's other
    hyperthread busy or not), each CPU on its own, so a 40-ms sample says which state one CPU was in then, not what
    the run had. ~0.3 % of one CPU (two CPUs x three 0.12-ms hashes per 250 ms). Timed by the thread's own CPU
    time, so neither the agent's other threads (the GIL) nor the run's processes (preemption) time into it; the
    best of three drops a try an interrupt landed in. stop() -> {"hash": mean ns per KiB over every sample,
    "per_cpu": {cpu: mean}, "samples": n} or None."""

    def __init__(self, cpus: set[int] | None = None, period_s: float = WATCH_PERIOD_S):
        import os
        import threading
        self.cpus = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
        self.period_s = period_s
        self.samples: dict[int, list[float]] = {c: [] for c in self.cpus}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="pp-cpu-speed", daemon=True)

    def start(self) -> SpeedWatch:
        self._thread.start()
        return self

    def _loop(self) -> None:
        import os
        while not self._stop.wait(self.period_s):
            for cpu in self.cpus:
                try:
                    os.sched_setaffinity(0, {cpu})   # this thread only (a Linux thread is its own task)
                except OSError:
                    continue                         # the CPU went offline or out of the cpuset
                best = math.inf
                for _ in range(3):
                    # the thread's own CPU time: not the wall clock, which also held the agent's other threads'
                    # hold on the GIL when blake2b gave it back, and the run's processes preempting it (a docker-dnat
                    # run's CPU 0 at 15,329 ns/KiB by the wall clock against 2,781 on CPU 1)
                    t = time.thread_time_ns()
                    hashlib.blake2b(_WATCH_BUF).digest()
                    best = min(best, (time.thread_time_ns() - t) / (len(_WATCH_BUF) / 1024))
                self.samples[cpu].append(best)

    def stop(self) -> dict | None:
        self._stop.set()
        self._thread.join(timeout=5)
        per_cpu = {str(c): round(statistics.fmean(v), 2) for c, v in self.samples.items() if v}
        every = [x for v in self.samples.values() for x in v]
        if not every:
            return None
        return {"hash": round(statistics.fmean(every), 2), "per_cpu": per_cpu, "samples": len(every)}
