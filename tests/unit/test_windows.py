"""Measurement windows: the schedule, transactions/TPS in and out of windows from a pgbench log, what the
summary divides by, and the ring-buffer span records -> traces table -> Perfetto."""
import numpy as np
import pandas as pd
import pytest
from pathprof.agent.probing import windows as pw
from pathprof.analysis import windows as W

T0 = 1_800_000_000 * 10**9     # a realtime origin (ns), as time.time_ns() gives


def _win(start_s, end_s, edge_s=0.01, mono_offset_ns=0):
    w = {}
    for name, t in (("attach", start_s - edge_s), ("start", start_s), ("end", end_s), ("detached", end_s + edge_s)):
        w[f"{name}_realtime_ns"] = T0 + int(t * 1e9)
        w[f"{name}_mono_ns"] = mono_offset_ns + int(t * 1e9)
    w["busy_ns"], w["elapsed_ns"] = int(2e9 * (end_s - start_s)), int(1e9 * (end_s - start_s))
    return w


def _log(rate_out, rate_in, windows_s, duration_s=10.0, lat_out=200.0, lat_in=300.0, clock_origin_us=T0 // 1000):
    """Synthetic pgbench -l rows: transaction ends at a steady rate, slower inside the windows."""
    ends, lats, t = [], [], 0.0
    while t < duration_s:
        inside = any(s <= t < e for s, e in windows_s)
        ends.append(t)
        lats.append(lat_in if inside else lat_out)
        t += 1.0 / (rate_in if inside else rate_out)
    ends_us = clock_origin_us + (np.array(ends) * 1e6).astype("int64")
    return pd.DataFrame({"client": 0, "txn": np.arange(len(ends)), "latency_us": lats, "script": 0,
                         "epoch_s": ends_us // 1_000_000, "epoch_us": ends_us % 1_000_000})


def test_split_counts_rates_and_overhead():
    spans = [(2.0, 3.0), (6.0, 7.0)]
    logs = _log(1000, 800, spans)
    meta = pw.window_meta([_win(*s) for s in spans], logs, 1.0, 4.0)
    i, o = meta["in_windows"], meta["outside_windows"]
    assert meta["log_clock"] == "realtime"
    assert i["txns"] == pytest.approx(1600, abs=5) and o["txns"] == pytest.approx(8000, rel=0.01)
    assert i["tps"] == pytest.approx(800, rel=0.01) and o["tps"] == pytest.approx(1000, rel=0.01)
    assert i["latency_ms_mean"] == pytest.approx(0.3) and o["latency_ms_mean"] == pytest.approx(0.2)
    assert meta["probe_overhead_pct"] == pytest.approx(20.0, abs=1.0)
    # run average: 2 s of 10 at -20 % -> about -4 %
    assert meta["probe_overhead_run_pct"] == pytest.approx(4.0, abs=1.0)
    # attach/detach edges are neither inside nor outside
    assert meta["edges"]["txns"] > 0 and meta["edges"]["duration_s"] == pytest.approx(0.04, abs=0.005)
    assert i["txns"] + o["txns"] + meta["edges"]["txns"] == len(logs)
    assert meta["in_windows"]["busy_ns"] == int(4e9) and meta["in_windows"]["windows"] == 2
    assert meta["schedule"] == {"window_s": 1.0, "period_s": 4.0, "duty_pct": 25.0, "always_on": False}


def test_split_matches_a_monotonic_log_against_monotonic_times():
    spans = [(3.0, 4.0)]
    boot_us = 5_000 * 10**6                        # pgbench log in CLOCK_MONOTONIC: small numbers
    logs = _log(1000, 500, spans, clock_origin_us=boot_us)
    meta = pw.window_meta([_win(*s, mono_offset_ns=boot_us * 1000) for s in spans], logs, 1.0, 10.0)
    assert meta["log_clock"] == "mono"
    assert meta["in_windows"]["tps"] == pytest.approx(500, rel=0.02)
    assert meta["probe_overhead_pct"] == pytest.approx(50.0, abs=2.0)


def test_no_overhead_figure_without_enough_outside():
    logs = _log(1000, 1000, [(0.0, 10.0)])
    meta = pw.window_meta([_win(-0.001, 10.5)], logs, 0.0, 0.0)       # always on
    assert meta["schedule"]["always_on"] and meta["schedule"]["duty_pct"] == 100.0
    assert meta["in_windows"]["txns"] == len(logs)
    assert meta["probe_overhead_pct"] is None


def test_split_empty_inputs():
    out = W.split(np.array([]), np.array([]), [])
    assert out["in_windows"]["txns"] == 0 and out["probe_overhead_pct"] is None


def test_plan_places_windows_inside_the_run():
    assert pw.plan(60, 1, 20) == [(9.5, 10.5), (29.5, 30.5), (49.5, 50.5)]
    assert pw.plan(60, 1, 0) is None and pw.plan(60, 2, 1) is None and pw.plan(60, 0, 10) is None
    (s, e), = pw.plan(8, 1, 20)                    # too short for a period: one window mid-run, same duty
    assert e - s == pytest.approx(0.4) and s + e == pytest.approx(8.0)
    (s, e), = pw.plan(2, 1, 20)
    assert e - s == pytest.approx(pw.MIN_WINDOW_S)
    for s, e in pw.plan(30, 1, 10):
        assert 0 < s < e <= 30 - pw.END_MARGIN_S
    it = pw.plan(None, 1, 10)                      # unknown length: endless
    assert next(it) == (4.5, 5.5) and next(it) == (14.5, 15.5)


class _SlowAttach:
    """A session whose programs take `attach_s` to attach, recording when each step happened (s from the start)."""

    def __init__(self, attach_s):
        import time
        self.attach_s, self.t0, self.steps, self.notes = attach_s, time.monotonic(), [], []

    def _step(self, name):
        import time
        self.steps.append((name, time.monotonic() - self.t0))

    prepared = False

    def prepare_window(self):               # as ProbeSession's: attached once, until the window closes
        import time
        if self.prepared:
            return
        self.prepared = True
        self._step("prepare")
        time.sleep(self.attach_s)

    def open_window(self):
        self._step("open")

    def close_window(self):
        self.prepared = False
        self._step("close")

    def poll(self):
        pass

    begin_calibration = end_calibration = poll


def test_a_window_s_programs_attach_before_it_and_a_late_open_keeps_its_length(monkeypatch):
    monkeypatch.setattr(pw, "PREPARE_LEAD_S", 0.1)
    monkeypatch.setattr(pw, "END_MARGIN_S", 0.05)
    on_time = _SlowAttach(0.02)                  # attached within the lead: the window opens as planned
    runner = pw.WindowRunner(on_time, 0.2, 0.4, 0.6)
    (s, e), = runner.plan
    runner.start()
    runner._thread.join(5)
    (p, tp), (o, to), (c, tc) = on_time.steps
    assert (p, o, c) == ("prepare", "open", "close") and tp < s - 0.05 and to == pytest.approx(s, abs=0.05)
    assert tc - to == pytest.approx(e - s, abs=0.05)
    late = _SlowAttach(0.3)                      # opened 0.2 s late: closes as late, within the run's end margin
    runner = pw.WindowRunner(late, 0.2, 0.4, 0.6)
    runner.start()
    runner._thread.join(5)
    (_, to), (_, tc) = late.steps[1:]
    assert to > s + 0.15 and tc == pytest.approx(min(e + (to - s), 0.6 - 0.05), abs=0.05) and tc - to > 0.1


def _run_after_start_up(log_dir, ready, after_s: float, pid: str, attach_s: float) -> _SlowAttach:
    """A 1.2-s windowed run (0.2 s every 0.4 s) whose start-up ends after_s in (pgbench's log appears), its
    programs attach_s to attach: the session's steps once the runner is done."""
    import threading
    for f in log_dir.iterdir():
        f.unlink()
    threading.Timer(after_s, lambda: (log_dir / f"pgbench_log.{pid}").write_text("")).start()
    session = _SlowAttach(attach_s)
    runner = pw.WindowRunner(session, 0.2, 0.4, 1.2, ready)
    runner.start()
    runner._thread.join(5)
    return session


def test_the_windows_count_from_the_end_of_the_loads_start_up(monkeypatch, tmp_path):
    """pgbench's setup connection (scale and partition queries) is no transaction's: an always-on window is
    attached while it runs and opens once pgbench's first thread created its log; a windowed plan counts from
    then; a start-up never seen to end lets the plan go on from the start, with a note."""
    import threading
    import time

    from pathprof.agent.postgres.pgbench import setup_done
    monkeypatch.setattr(pw, "PREPARE_LEAD_S", 0.05)
    ready = setup_done(tmp_path)
    threading.Timer(0.3, lambda: (tmp_path / "pgbench_log.4242").write_text("")).start()
    always = _SlowAttach(0.01)
    runner = pw.WindowRunner(always, 0, 0, 2.0, ready)
    runner.start()
    time.sleep(0.6)
    runner.stop()
    runner.session.close_window()
    (p, tp), (o, to) = always.steps[:2]
    assert (p, o) == ("prepare", "open") and tp < 0.1 and to == pytest.approx(0.3, abs=0.08), always.steps
    for f in tmp_path.iterdir():
        f.unlink()
    threading.Timer(0.3, lambda: (tmp_path / "pgbench_log.4243.1").write_text("")).start()
    windowed = _SlowAttach(0.01)
    runner = pw.WindowRunner(windowed, 0.2, 0.4, 1.2, ready)
    (s, _), *_ = runner.plan
    runner.start()
    time.sleep(0.3 + s + 0.1)
    runner.stop()
    opened = [t for n, t in windowed.steps if n == "open"]
    assert opened and opened[0] == pytest.approx(0.3 + s, abs=0.08), windowed.steps
    # a start-up that took most of the run: the window is placed over what is left, not past its end (CI ci43c:
    # a TCG guest's 6-s run whose one window opened after pgbench had ended)
    slow = _run_after_start_up(tmp_path, ready, 0.8, "4244", 0.01)
    (_, to), (_, tc) = [x for x in slow.steps if x[0] in ("open", "close")]
    assert 0.8 < to and tc <= 1.2 and tc - to >= 0.15, slow.steps       # 1.2 s: pgbench's end
    # the first window's programs attach while the load starts up: 0.5 s to attach (a TCG guest took 5.4 s, CI
    # ci43e) no longer pushes the window past its planned start (0.3 + 0.1 s) by the attach time
    slow_attach = _run_after_start_up(tmp_path, ready, 0.3, "4245", 0.5)
    (p, tp), (o, to) = slow_attach.steps[:2]
    assert (p, o) == ("prepare", "open") and tp < 0.1 and to < 0.6, slow_attach.steps
    monkeypatch.setattr(pw, "READY_MAX_S", 0.2)
    never = _SlowAttach(0.01)
    runner = pw.WindowRunner(never, 0, 0, 10.0, lambda: False)
    runner.start()
    time.sleep(0.4)
    runner.stop()
    assert [n for n, _ in never.steps][:2] == ["prepare", "open"] and never.steps[1][1] == pytest.approx(0.2, abs=0.08)
    assert "start-up was not seen to end" in never.notes[0]


def test_probe_duty_flag_sets_the_period():
    import argparse

    from pathprof.agent.cli.args import probe_period
    from pathprof.errors import UserError
    ns = lambda **k: argparse.Namespace(**{"probe_window": 1.0, "probe_period": 20.0, "probe_duty": None, **k})  # noqa: E731
    assert probe_period(ns()) == 20.0
    assert probe_period(ns(probe_duty=10.0)) == pytest.approx(10.0)
    assert probe_period(ns(probe_duty=100.0)) == 0.0
    with pytest.raises(UserError):
        probe_period(ns(probe_duty=0.0))


def test_summary_divides_by_transactions_in_windows(tmp_path):
    from pathprof.analysis.rundir import RunDir
    from pathprof.analysis.summary import summarize
    rd = RunDir.create(tmp_path, "loopback")
    # 100,000 transactions in the run, 10,000 inside the windows; the probe tables hold only those
    rd.update(workload={"clients": 1, "duration_s": 10}, host={"cpus": 2},
              pgbench={"result": {"tps": 10000.0, "transactions": 100000, "latency_ms": {"mean": 0.1}}},
              cpu={"busy_ns": 10 * 10**9, "elapsed_ns": 10 * 10**9, "ncpu": 2},
              probes={"level": "basic", "cost": {"run_time_ns": 10000 * 2000},
                      "windows": [_win(4.5, 5.5)], "schedule": {"window_s": 1, "period_s": 10, "duty_pct": 10},
                      "in_windows": {"txns": 10000, "tps": 8000.0, "latency_ms_mean": 0.125,
                                     "busy_ns": 10**9, "elapsed_ns": 10**9},
                      "outside_windows": {"txns": 90000, "tps": 10000.0},
                      "probe_overhead_pct": 20.0, "probe_overhead_run_pct": 2.0})
    rd.write_frame("stages.parquet", pd.DataFrame([
        {"kind": "proc", "role": "backend", "hop": "", "leg": "server", "hook": "", "netns": "", "dev": "",
         "count": 10000, "sum_ns": 10000 * 100_000, "hist": None},
        {"kind": "proc", "role": "pgbench", "hop": "", "leg": "client", "hook": "", "netns": "", "dev": "",
         "count": 10000, "sum_ns": 10000 * 25_000, "hist": None}]))
    rd.write_frame("cpu.parquet", pd.DataFrame([
        {"comp": "user", "role": "backend", "hop": "", "where": "", "ns": 10**9, "count": 1}]))
    d = summarize(RunDir.open(rd.path))
    assert d["probe_overhead_pct"] == 20.0
    assert d["probe_cost_ns_per_txn"] == pytest.approx(2000)
    st = {s["name"]: s["us_per_txn"] for s in d["stages"]}
    assert st["backend.execute"] == pytest.approx(100.0) and st["client.pgbench"] == pytest.approx(25.0)
    # cycle at 8000 TPS, 1 client = 125 µs = the stages: closes; CPU: 1 s busy in windows = components
    assert d["closure"]["latency_error_pct"] == pytest.approx(0.0, abs=0.01)
    assert d["closure"]["cpu_error_pct"] == pytest.approx(0.0, abs=0.01)
    # the probes' 2 µs ran inside the backend's time: carved out, the sum (the closure) unchanged
    assert d["cpu"] == [{"component": "backend.user", "us_per_txn": 98.0}, {"component": "probes", "us_per_txn": 2.0}]
    # latency-bound (1 of 2 CPUs busy): the model with probes gives the in-window 8000 TPS back; without
    # them 1 / (125 - 2) µs, checked against the 10,000 TPS measured outside the windows
    assert d["predicted_probed_tps"] == pytest.approx(8000.0)
    assert d["prediction"]["unprobed_tps"] == pytest.approx(1e6 / 123, rel=1e-3)
    assert d["prediction"]["measured_outside_tps"] == 10000.0
    assert d["prediction"]["error_pct"] == pytest.approx((1e6 / 123 - 10000) / 100, abs=0.1)
    assert d["windows"]["count"] == 1 and d["windows"]["tps_in"] == 8000.0
    assert d["tps"] == 10000.0                       # the run's TPS stays pgbench's


def test_the_cycle_counts_each_client_to_its_last_transaction(tmp_path):
    # 2 clients always on, 10 s in the window, 1000 transactions: clients / TPS says 20 ms a transaction; one client
    # finished at 5 s (the run went on for the other's SYN wait), so the clients were 15 s at work: 15 ms a cycle
    from pathprof.analysis.rundir import RunDir
    from pathprof.analysis.summary import summarize
    rd = RunDir.create(tmp_path, "nic")
    rd.update(workload={"clients": 2, "duration_s": 10}, host={"cpus": 2},
              pgbench={"result": {"tps": 100.0, "transactions": 1000, "latency_ms": {"mean": 15.0}}},
              probes={"level": "basic", "windows": [_win(0, 10)],
                      "schedule": {"window_s": 0, "period_s": 0, "duty_pct": 100, "always_on": True},
                      "in_windows": {"txns": 1000, "tps": 100.0, "latency_ms_mean": 15.0, "duration_s": 10.0,
                                     "client_s": 15.0}})
    rd.write_frame("stages.parquet", pd.DataFrame([
        {"kind": "proc", "role": "backend", "hop": "", "leg": "server", "hook": "", "netns": "", "dev": "",
         "count": 1000, "sum_ns": 1000 * 15_000_000, "hist": None}]))
    d = summarize(RunDir.open(rd.path))
    assert d["closure"]["cycle_us"] == pytest.approx(15_000.0)
    assert d["closure"]["latency_error_pct"] == pytest.approx(0.0, abs=0.01)


def test_trace_records_become_a_valid_perfetto_trace():
    import ctypes as C

    from pathprof.agent.probing.bpf import layout as L
    from pathprof.agent.probing.frames import trace_frame
    from pathprof.analysis.export.files import to_perfetto, validate_trace_events
    recs = []
    for seq, (stage, role, leg) in enumerate([(1, 2, 1), (6, 2, 2), (1, 1, 3), (6, 1, 4)], start=1):
        recs.append(bytes(L.Trace(ts=1000 * seq, dur=500, pid=10 + role, tid=20 + role, seq=seq, stage=stage,
                                  role=role, leg=leg, hop=0)))
    assert C.sizeof(L.Trace) == 48         # + the markers' tuple and TCP sequence number (pathprof merge)
    df = trace_frame(recs, {})
    assert list(df.columns[:7]) == ["ts_ns", "dur_ns", "pid", "tid", "role", "stage", "txn"]
    assert list(df["stage"]) == ["wire.backend", "backend.execute", "wire.pgbench", "client.pgbench"]
    doc = to_perfetto(df, {})
    assert validate_trace_events(doc) == []
    assert sum(1 for e in doc["traceEvents"] if e["ph"] == "X") == 4
    assert len(trace_frame([], {})) == 0
