"""A hop's own counters (a pooler's waiting clients), sampled while pgbench runs, so the probes' poolwait stage
can be checked against what the pooler itself says: by Little's law the mean number of clients waiting equals
the arrival rate times the mean wait, i.e. TPS x poolwait per transaction. Recorded in run.json
(`pooler_counters`), read by analysis.summary."""
from __future__ import annotations

import threading
import time


class PoolerCounters:
    """Samples every service that keeps counters, every `every_s`, on a thread of its own; a hop whose counters
    fail once (its admin console refuses us) is left alone, with the reason kept."""

    def __init__(self, services, every_s: float = 0.2):
        self.services = [s for s in services if type(s).counters is not _base_counters()]
        self.every_s = every_s
        self.samples: dict[str, list[dict]] = {s.hop: [] for s in self.services}
        self.errors: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.services and self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="pooler-counters", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            for s in self.services:
                if s.hop in self.errors:
                    continue
                try:
                    c = s.counters()
                except Exception as e:        # the hop's console is not ours to fix: say why, stop asking it
                    self.errors[s.hop] = f"{type(e).__name__}: {str(e).strip()[:200]}"
                    continue
                if c is not None:
                    self.samples[s.hop].append({"mono_ns": time.monotonic_ns(), **c})

    def stop(self) -> dict:
        """{hop: {"source", "samples": [...], "error"?}} for run.json; closes what the services held open."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        out = {}
        for s in self.services:
            out[s.hop] = {"source": s.counters_source or f"{s.kind} admin console", "servers_are": s.servers_are,
                          "busy_is": s.busy_is,
                          "every_s": self.every_s, "samples": self.samples[s.hop]}
            try:
                final = s.final_counters() if s.hop not in self.errors else None
            except Exception as e:
                final, self.errors[s.hop] = None, f"{type(e).__name__}: {str(e).strip()[:200]}"
            if final:
                out[s.hop]["at_end"] = final
            if s.hop in self.errors:
                out[s.hop]["error"] = self.errors[s.hop]
            try:
                s.close_counters()
            except Exception:
                pass
        return out


def _base_counters():
    from pathprof.topologies.services import Service
    return Service.counters
