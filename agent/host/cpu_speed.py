"""How fast this machine's CPUs ran through a run's load: fixed work, timed on every CPU in turn, all along.

A virtual machine's CPU is not a constant: the host's other tenants, its frequency and its caches make the same
work take 15-30 % longer for tens of seconds at a time (a 16-client loopback run here gave 104,682 then 75,796 TPS
two minutes apart, every component's CPU per transaction larger by one ratio). One run cannot tell that from its
path; two runs compared (`predict` against the run it predicts, `compare`, `diff`) can, when each recorded the
machine's speed through it (read by analysis.speed.sampled_ratio). A sample before the load and one after it do
not: each vCPU here flips between two speeds ~1.7x apart every few seconds, each on its own (bench/speed_drift: by
two such 40-ms samples the TPS's spread grew), so the watch below samples every CPU through the whole load.
"""
from __future__ import annotations

import hashlib
import math
import os
import statistics
import threading
import time

_WATCH_BUF = bytes(range(256)) * 256             # 64 KiB: ~0.12 ms of hashing a try here
WATCH_PERIOD_S = 0.25
MAX_DUTY = 0.005                                 # of one CPU, the watch's rounds at most (0.3 % here at 250 ms)


class SpeedWatch:
    """The speed of each CPU while the load runs, for the run's whole length: every WATCH_PERIOD_S, on each CPU in
    turn (the thread pinned to it), the best of three blake2b hashes of 64 KiB. Why not one sample before and one
    after: on this VM each vCPU flips between two speeds ~1.7x apart every few seconds (another tenant on the host's
    core, most likely), each CPU on its own, so a 40-ms sample says which state one CPU was in then, not what
    the run had. ~0.3 % of one CPU (two CPUs x three 0.12-ms hashes per 250 ms), never above MAX_DUTY. Timed by
    the thread's own CPU time, so neither the agent's other threads (the GIL) nor the run's processes (preemption)
    time into it; the best of three drops a try an interrupt landed in. stop() -> {"hash": mean ns per KiB over
    every sample, "per_cpu": {cpu: mean}, "samples": n} or None."""

    def __init__(self, cpus: set[int] | None = None, period_s: float = WATCH_PERIOD_S):
        self.cpus = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
        self.period_s = period_s
        self.samples: dict[int, list[float]] = {c: [] for c in self.cpus}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="pp-cpu-speed", daemon=True)

    def start(self) -> SpeedWatch:
        self._thread.start()
        return self

    def _loop(self) -> None:
        wait = self.period_s
        while not self._stop.wait(wait):
            t0 = time.thread_time_ns()
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
            # never more than MAX_DUTY of the machine: on a slow CPU (a TCG guest hashes ~50x slower) a round of
            # samples takes longer, and the next one waits longer (ci46b-1: the guest's closure -26.6 %)
            took = (time.thread_time_ns() - t0) / 1e9     # the watch's own CPU for the round
            wait = max(self.period_s, took / MAX_DUTY)

    def stop(self) -> dict | None:
        self._stop.set()
        self._thread.join(timeout=5)
        per_cpu = {str(c): round(statistics.fmean(v), 2) for c, v in self.samples.items() if v}
        every = [x for v in self.samples.values() for x in v]
        if not every:
            return None
        return {"hash": round(statistics.fmean(every), 2), "per_cpu": per_cpu, "samples": len(every)}
