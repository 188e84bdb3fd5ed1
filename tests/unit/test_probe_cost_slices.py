"""agent.probing.cost's calibration slices and agent.probing.windows' timing of them: a slice is a measurement only
when its time and its counters cover the same stretch (CI of dd23880: a slice begun after its planned end lasted
1 ms by its clock, its counters held seconds of program runs against 634 messages, scaled 871x, and the run's
"probe" CPU took every process's)."""
import os
import time

import pytest
from pathprof.agent.probing import cost as C
from pathprof.agent.probing import windows as pw
from pathprof.agent.probing.bpf import libbpf


class _Counters:
    """What the programs' counters and the messages stat read as, on a clock of the test's own (the cost module's
    `time`): a reading takes `read_s` of it, and time passes only when the test runs the programs."""

    def __init__(self, monkeypatch):
        self.run_time_ns, self.run_cnt, self.messages, self.read_s, self.now_ns = 0, 0, 0, 0.0, 10**12
        monkeypatch.setattr(libbpf, "enable_stats", lambda: os.open("/dev/null", os.O_RDONLY))
        monkeypatch.setattr(C, "time", self)
        monkeypatch.setattr(C.F, "read_stats", lambda obj, only=(): self._read({"messages": self.messages}))
        monkeypatch.setattr(C.F, "prog_stats", lambda objs: {
            "pp_sched_switch": {"run_time_ns": self.run_time_ns, "run_cnt": self.run_cnt, "recursion_misses": 0}})

    def monotonic_ns(self) -> int:
        return self.now_ns

    def _read(self, out):
        self.now_ns += int(self.read_s * 1e9)
        return out

    def run(self, seconds: float, messages: int, runs: int, ns_per_run: int = 100) -> None:
        self.now_ns += int(seconds * 1e9)
        self.messages += messages
        self.run_cnt += runs
        self.run_time_ns += runs * ns_per_run


def test_a_slice_scales_its_programs_by_the_messages(monkeypatch):
    c, cal = _Counters(monkeypatch), C.CostCalibration()
    cal.begin(None)
    c.run(0.05, 1000, 5000)
    assert cal.end(None) is True
    est = cal.estimate(10_000)
    assert est["run_time_ns"] == 10 * 5000 * 100 and est["run_cnt"] == 50_000
    assert est["calibration"]["slices"] == 1 and "rejected" not in est["calibration"]


def test_slices_whose_time_and_counters_disagree_are_dropped(monkeypatch):
    c, cal = _Counters(monkeypatch), C.CostCalibration()
    cal.begin(None)                          # ended at once: the time to read it, not a measurement
    assert cal.end(None) is False and "ms long" in cal.rejected[-1]
    c.read_s = 0.03                          # its first reading held up 30 ms, its last not: the two spans differ
    cal.begin(None)
    c.read_s = 0.0
    c.run(0.05, 1000, 5000)
    assert cal.end(None) is False and "a reading held up" in cal.rejected[-1]
    c.read_s = 0.0                           # programs that ran 20 s in 50 ms on this machine's CPUs
    cal.begin(None)
    c.run(0.05, 1000, 200_000, ns_per_run=100_000)
    assert cal.end(None) is False and "its programs ran" in cal.rejected[-1]
    est = cal.estimate(10_000)
    assert est["run_time_ns"] is None and est["calibration"]["slices"] == 0        # unmeasured, and said so
    assert len(est["calibration"]["rejected"]) == 3
    cal.begin(None)                          # a good slice after them is the measurement
    c.run(0.05, 1000, 5000)
    assert cal.end(None) is True and cal.estimate(2000)["run_time_ns"] == 2 * 5000 * 100
    c.read_s = 0.03                          # readings as slow at both ends (a TCG guest's): kept
    cal.begin(None)
    c.run(0.1, 1000, 5000)
    assert cal.end(None) is True and cal.slices == 2


class _Slices:
    """A session recording when its calibration slices begin and end (s from its start); the first `drop`
    slices are dropped by the cost module."""

    def __init__(self, drop=0, open_late_s=0.0):
        self.t0, self.slices, self.drop, self.open_late_s, self.notes = time.monotonic(), [], drop, open_late_s, []

    def prepare_window(self):
        pass

    def open_window(self):
        time.sleep(self.open_late_s)

    def close_window(self):
        pass

    def poll(self):
        pass

    def begin_calibration(self):
        self.slices.append([time.monotonic() - self.t0, None])

    def end_calibration(self):
        self.slices[-1][1] = time.monotonic() - self.t0
        return len(self.slices) > self.drop


def test_a_window_opened_late_still_calibrates_for_the_slices_length(monkeypatch):
    monkeypatch.setattr(pw, "PREPARE_LEAD_S", 0.0)
    session = _Slices(open_late_s=0.15)      # its open took longer than the slice's planned length
    runner = pw.WindowRunner(session, 0.5, 1.0, 1.5)
    runner.start()
    runner._thread.join(5)
    ((b, e),) = session.slices
    # the whole slice from when it began (the old plan had ended it at once); later only by the machine's delays
    assert runner.cal_s == pytest.approx(0.1) and runner.cal_s - 0.01 <= e - b < runner.cal_s + 0.5


def test_a_dropped_slice_is_taken_again_while_the_window_has_room(monkeypatch):
    monkeypatch.setattr(pw, "PREPARE_LEAD_S", 0.0)
    session = _Slices(drop=1)
    runner = pw.WindowRunner(session, 0.5, 1.0, 1.5)
    runner.start()
    runner._thread.join(5)
    assert len(session.slices) == 2 and all(e - b >= runner.cal_s - 0.01 for b, e in session.slices)
    session = _Slices(drop=pw.CALIBRATION_TRIES + 1)
    runner = pw.WindowRunner(session, 0.5, 1.0, 1.5)
    runner.start()
    runner._thread.join(5)
    assert len(session.slices) == pw.CALIBRATION_TRIES        # bounded: the cost then stays unmeasured, and says so


def test_a_run_whose_slices_were_all_dropped_says_its_probe_cost_is_unmeasured(tmp_path):
    import json
    import shutil
    from pathlib import Path

    from pathprof.analysis.rundir import RunDir
    from pathprof.analysis.summary import summarize
    run = tmp_path / "loopback"
    shutil.copytree(Path(__file__).parent / "data" / "runs" / "loopback", run)
    doc = json.loads((run / "run.json").read_text())
    measured = summarize(RunDir.open(run))["probe_cost_ns_per_txn"]
    doc["probes"]["cost"].update(run_time_ns=None, run_cnt=None,
                                 calibration={"slices": 0, "rejected": ["1.0 ms long", "1.2 ms long"]})
    (run / "run.json").write_text(json.dumps(doc))
    s = summarize(RunDir.open(run))
    assert measured is not None and s["probe_cost_ns_per_txn"] is None
    (note,) = [n for n in s["notes"] if "own cost was not measured" in n]
    assert "1.0 ms long; 1.2 ms long" in note
