"""The CPU view's reference: busy time from the kernel's no-HZ idle time, and the component idle.wakeups (the
idle tasks' on-CPU time less that sleep) that makes the components add up to it. Arithmetic on known figures:
the timer_list reading, the idle row, the closure against both references, windows, merged machines."""
import pandas as pd
import pytest
from pathprof.agent.host.machine import timer_list_cpu
from pathprof.agent.probing import frames as F
from pathprof.agent.probing.session import windows_asleep_ns
from pathprof.agent.probing.windows import cpu_in_windows
from pathprof.analysis import stages as views

TIMER_LIST = """Timer List Version: v0.10
HRTIMER_MAX_CLOCK_BASES: 8
now at 700000000000 nsecs

cpu: 0
 clock 0:
  .idle_entrytime : 699000000000 nsecs
  .idle_sleeptime : 300000000000 nsecs
  .iowait_sleeptime: 5000000000 nsecs
  .last_jiffies   : 4295069791

cpu: 1
 clock 0:
  .idle_sleeptime : 250000000123 nsecs
  .iowait_sleeptime: 7 nsecs

Tick Device: mode:     1
"""


def test_timer_list_gives_each_cpus_sleep_idle_plus_iowait_in_ns():
    assert timer_list_cpu(TIMER_LIST, 0) == (700_000_000_000, 305_000_000_000)
    assert timer_list_cpu(TIMER_LIST, 1) == (700_000_000_000, 250_000_000_130)
    assert timer_list_cpu(TIMER_LIST, 2) is None                        # no such CPU
    assert timer_list_cpu(TIMER_LIST.replace(".iowait_sleeptime", ".other"), 0) is None   # a format it does not know


def _reading(idle_ns, idle_cnt, other_ns=0):
    return {"roles": {}, "cpust": {"other": other_ns, "nf": 0, "softirq_cnt": 0, "softirq_task": 0,
                                   "softirq_idle": 0, "softirq_other": 0, "idle": idle_ns, "idle_cnt": idle_cnt}}


def test_idle_row_is_the_idle_tasks_time_less_the_cpus_sleep_never_negative():
    base, now = _reading(1_000, 10), _reading(11_000_000 + 1_000, 510)
    cpu = F.cpu_frame(now, base, {}, asleep_ns=8_000_000)
    idle = cpu[cpu["comp"] == "idle"].iloc[0]
    assert idle["ns"] == 3_000_000 and idle["count"] == 500       # 11 ms on CPU, 8 ms asleep: 3 ms awake
    assert "idle" not in set(F.cpu_frame(now, base, {})["comp"])    # no sleep reading: no row (tick reference)
    over = F.cpu_frame(now, base, {}, asleep_ns=12_000_000)          # window edges: more sleep than idle task
    assert over[over["comp"] == "idle"].iloc[0]["ns"] == 0


def _machine(txns=1000, elapsed=1_000_000_000, tasks_ns=600_000_000, asleep_ns=1_200_000_000,
             tick_missed_ns=150_000_000):
    """A 2-CPU machine over `elapsed`: its tasks ran tasks_ns, its idle tasks the rest; the CPUs slept asleep_ns
    of that; the tick samples missed tick_missed_ns of the tasks' time (timer work right after a tick)."""
    idle_task = 2 * elapsed - tasks_ns
    cpu = pd.DataFrame([{"comp": "user", "role": "backend", "hop": "", "where": "", "ns": tasks_ns, "count": 0},
                        {"comp": "idle", "role": "", "hop": "", "where": "",
                         "ns": int(F.idle_wakeups_ns(idle_task, asleep_ns)), "count": 0}])
    return cpu, txns, 2 * elapsed - asleep_ns, tasks_ns - tick_missed_ns


def test_the_components_close_against_the_nohz_busy_time_and_the_tick_figure_is_off():
    cpu, txns, busy, tick = _machine()
    cv = views.cpu_view(cpu, txns, busy, 1_000_000_000, 2)
    names = {c["component"]: c["us_per_txn"] for c in cv["components"]}
    assert names == {"backend.user": 600.0, "idle.wakeups": 200.0}          # 2 s - 0.6 s on tasks - 1.2 s asleep
    assert cv["closure_error_pct"] == 0.0 and cv["busy_cpus"] == 0.8
    # the tick-sampled reference (pre-1.2): the tasks alone against what the ticks saw of them
    assert views.tick_closure_pct(cv, txns, tick) == pytest.approx((600 - 450) / 450 * 100, abs=0.01)


def test_regime_and_predicted_tps_with_the_nohz_reference():
    """A saturated machine sleeps ~never: idle.wakeups ~0 and the prediction is the CPUs over CPU per
    transaction; a latency-bound one predicts from the cycle, idle.wakeups changing nothing there."""
    cpu, txns, busy, _ = _machine(tasks_ns=1_980_000_000, asleep_ns=10_000_000)
    cv = views.cpu_view(cpu, txns, busy, 1_000_000_000, 2)
    assert cv["regime"] == "cpu-bound"
    assert cv["predicted_tps"] == pytest.approx(txns / 1.0, rel=1e-3)      # the run's own rate, closure exact
    cpu, txns, busy, _ = _machine()
    cv = views.cpu_view(cpu, txns, busy, 1_000_000_000, 2, clients=1, latency_us=1000.0)
    assert cv["regime"] == "latency-bound" and cv["predicted_tps"] == 1000.0


def test_windows_use_the_nohz_busy_time_only_when_every_window_has_it():
    nohz = {"busy_ns": 900, "busy_tick_ns": 700, "asleep_ns": 1100, "elapsed_ns": 1000, "busy_source": "nohz"}
    tick = {"busy_ns": 650, "busy_tick_ns": 650, "elapsed_ns": 1000, "busy_source": "tick"}
    old = {"busy_ns": 640, "elapsed_ns": 1000}                                # recorded before 1.2
    assert cpu_in_windows([nohz, nohz]) == {"busy_ns": 1800, "busy_tick_ns": 1400, "busy_source": "nohz",
                                            "asleep_ns": 2200, "elapsed_ns": 2000, "windows": 2}
    mixed = cpu_in_windows([nohz, tick, old])
    assert mixed["busy_ns"] == 700 + 650 + 640 and mixed["busy_source"] == "tick" and "asleep_ns" not in mixed
    assert windows_asleep_ns([nohz, old]) is None and windows_asleep_ns([]) is None


def test_a_merged_run_sums_each_machines_nohz_busy_and_its_idle_row(tmp_path):
    from pathprof.analysis.merge import merge
    from pathprof.analysis.rundir import RunDir
    from pathprof.analysis.summary import summarize
    from test_merge import TWO_MACHINES, N, two_runs
    c, s, _ = two_runs(tmp_path, cpu=TWO_MACHINES, machines=("vm1", "vm2"))
    for path, idle_us, tick_us in ((c, 4.0, 9.0), (s, 2.0, 8.0)):          # each machine's waking from idle
        rd = RunDir.open(path)
        cpu = rd.read_frame("cpu.parquet")
        idle = pd.DataFrame([{"comp": "idle", "role": "", "hop": "", "where": "", "ns": int(idle_us * 1e3 * N),
                              "count": 0}])
        rd.write_frame("cpu.parquet", pd.concat([cpu, idle], ignore_index=True))
        busy = rd.meta["cpu"]["busy_ns"] + int(idle_us * 1e3 * N)
        rd.update(cpu={**rd.meta["cpu"], "busy_ns": busy, "busy_tick_ns": int(tick_us * 1e3 * N),
                       "busy_source": "nohz"})
    d = summarize(merge([c, s], tmp_path / "m", tmp_path))
    got = {x["component"]: x["us_per_txn"] for x in d["cpu"]}
    assert got["idle.wakeups@cli"] == 4.0 and got["idle.wakeups@srv"] == 2.0
    assert d["closure"]["cpu_error_pct"] == pytest.approx(0.0, abs=0.01)
    assert d["closure"]["cpu_reference"] == "nohz"
    meta = RunDir.open(d["run_dir"]).meta["cpu"]
    assert meta["busy_ns"] == (13 + 4 + 11 + 2) * 1000 * N and meta["busy_tick_ns"] == (9 + 8) * 1000 * N
    # one machine read the tick way (an older run): every machine's tick busy time, no idle rows
    rd = RunDir.open(s)
    rd.update(cpu={k: v for k, v in rd.meta["cpu"].items() if k not in ("busy_source", "busy_tick_ns")})
    d = summarize(merge([c, s], tmp_path / "m2", tmp_path))
    assert not any(x["component"].startswith("idle.") for x in d["cpu"])
    assert d["closure"]["cpu_reference"] == "tick"


def test_a_run_recorded_before_the_nohz_reference_reads_as_it_was():
    """Recorded runs (tests/unit/data/runs, schema 1.0) have no busy_source and no idle row: tick reference."""
    from pathlib import Path

    from pathprof.analysis.rundir import RunDir
    from pathprof.analysis.summary import summarize
    runs = sorted(p for p in (Path(__file__).parent / "data" / "runs").iterdir() if (p / "cpu.parquet").exists())
    assert runs
    for path in runs:
        d = summarize(RunDir.open(path))
        assert d["closure"].get("cpu_reference") == "tick" and "cpu_error_tick_pct" not in d["closure"]
        assert not any(x["component"].startswith("idle.") for x in d["cpu"])
