"""status.json is written off the progress callback's thread: a slow collection (map usage at 96 clients) never
holds the callback up, and a write still in flight makes the next one skip instead of piling up."""
import json
import threading
import time
from types import SimpleNamespace

from pathprof.agent.run.status import StatusFile


class SlowProbes:
    """Stands in for the probe session's status(): takes `delay_s` and counts its calls."""

    def __init__(self, delay_s: float):
        self.delay_s, self.calls, self.release = delay_s, 0, threading.Event()

    def status(self, _usage):
        self.calls += 1
        self.release.wait(self.delay_s)
        return {"maps": [{"name": "socks", "entries": 7}]}


def _progress(t: float):
    return SimpleNamespace(elapsed_s=t, tps=1000.0)


def test_a_slow_collection_does_not_hold_up_the_caller(tmp_path):
    probes = SlowProbes(delay_s=2.0)
    status = StatusFile(tmp_path / "status.json", probes, every_s=0.01, duration_s=60)
    t0 = time.monotonic()
    status.update(_progress(1.0))
    assert time.monotonic() - t0 < 0.5                       # returned while the collection still runs
    time.sleep(0.05)
    status.update(_progress(2.0))                             # due, but the first write is in flight: skipped
    probes.release.set()
    status.close()
    assert probes.calls == 1
    doc = json.loads((tmp_path / "status.json").read_text())
    assert doc["elapsed_s"] == 1.0 and doc["maps"][0]["entries"] == 7
    assert doc["collect_ms"] >= 0 and doc["agent_rss_kb"] > 0


def test_writes_resume_once_the_previous_one_is_done(tmp_path):
    probes = SlowProbes(delay_s=0.0)
    status = StatusFile(tmp_path / "status.json", probes, every_s=0.01, duration_s=60)
    for t in (1.0, 2.0, 3.0):
        status.update(_progress(t))
        status.close()
        time.sleep(0.02)
    assert probes.calls == 3
    assert json.loads((tmp_path / "status.json").read_text())["elapsed_s"] == 3.0
