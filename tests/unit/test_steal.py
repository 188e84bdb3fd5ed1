"""Steal time (analysis.steal): a hypervisor's share of the CPUs named, over the views' own interval, and a run
that recorded none reads as before."""
import json
import shutil
from pathlib import Path

from pathprof.agent.host.machine import cpu_times, proc_stat_ns
from pathprof.analysis.rundir import RunDir
from pathprof.analysis.steal import NOTE_PCT, steal_figures, steal_note
from pathprof.analysis.summary import summarize

RUNS = Path(__file__).parent / "data" / "runs"


def test_share_is_of_the_cpus_time_and_per_transaction():
    fig = steal_figures(steal_ns=40e6, elapsed_ns=2e9, ncpu=2, txns=1000)
    assert fig == {"ns": 40_000_000, "pct": 1.0, "us_per_txn": 40.0}
    assert steal_figures(None, 2e9, 2, 10) is None          # not recorded: nothing said
    assert steal_figures(0, 2e9, 2, 10)["pct"] == 0.0


def test_note_only_above_a_quiet_hosts_noise():
    assert steal_note(steal_figures(0.5 * NOTE_PCT / 100 * 4e9, 2e9, 2, 100)) is None
    note = steal_note(steal_figures(3 * NOTE_PCT / 100 * 4e9, 2e9, 2, 100), cycle_us=250.0)
    assert note.startswith(f"the hypervisor took {3 * NOTE_PCT:.1f} %") and "250.0-µs cycle" in note


def test_proc_stat_steal_is_counted_and_kept_apart_from_idle():
    busy, total, steal = proc_stat_ns()
    assert 0 <= steal <= busy <= total
    assert cpu_times()["steal_ns"] >= steal


def test_a_run_with_steal_in_its_windows_names_it(tmp_path):
    run = tmp_path / "loopback"
    shutil.copytree(RUNS / "loopback", run)
    meta = json.loads((run / "run.json").read_text())
    before = summarize(RunDir.open(run))
    assert "steal" not in before                              # recorded before steal was: says nothing
    inside = meta["probes"]["in_windows"]
    inside["steal_ns"] = 0.05 * inside["elapsed_ns"] * 2      # 5 % of two CPUs' time in the window
    (run / "run.json").write_text(json.dumps(meta))
    after = summarize(RunDir.open(run))
    assert after["steal"]["pct"] == 5.0
    assert after["steal"]["us_per_txn"] == round(inside["steal_ns"] / 1e3 / inside["txns"], 2)
    assert any(n.startswith("the hypervisor took 5.0 %") for n in after["notes"])
    # the views are what they were: steal is named, not carved out of any stage
    assert after["closure"] == before["closure"] and after["stages"] == before["stages"]


def test_steal_is_a_metric_where_the_run_recorded_it():
    from pathprof.analysis.export.openmetrics import render
    from prometheus_client.openmetrics.parser import text_string_to_metric_families
    s = {**summarize(RunDir.open(RUNS / "loopback")), "run_id": "r1"}
    fams = {f.name: f for f in text_string_to_metric_families(render([s]))}
    assert "pathprof_steal_ratio" not in fams
    s["steal"] = {"ns": 1, "pct": 2.5}
    fams = {f.name: f for f in text_string_to_metric_families(render([s]))}
    assert fams["pathprof_steal_ratio"].samples[0].value == 0.025


def test_a_recorded_connect_run_with_steal():
    """A real 1-client -C run over nic recorded in a CI round (tests/unit/data/recent/nic-connect-steal, schema
    1.3): the hypervisor took 8.7 % of its window's CPU time. The note names it; pgbench's latency leaves out the
    connections' set-up, which is no sign of lazy timestamps (that note was said of every -C run)."""
    s = summarize(RunDir.open(RUNS.parent / "recent" / "nic-connect-steal"))
    assert s["workload"]["connect"] and s["steal"]["pct"] > NOTE_PCT
    assert any(n.startswith("the hypervisor took") for n in s["notes"])
    assert not any("timestamps lazily" in n for n in s["notes"]), s["notes"]
    connect = sum(x["us_per_txn"] for x in s["stages"] if x["leg"] == "connect")
    assert connect > 0.5 * s["closure"]["cycle_us"]          # where the rest of the cycle is
