"""Duty-cycled probes in real runs: windows recorded in run.json, the views built from the transactions inside
them still close, and --trace-sample spans export to a valid Perfetto trace."""
import json
import os
from pathlib import Path

import pytest
from conftest import run_pathprof
from pathprof.agent.probing import windows as pw

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _root():
    if os.geteuid() != 0:
        pytest.skip("needs root")


def _run(runs_dir, *args):
    cp = run_pathprof("run", "--topology", "loopback", "--probes", "basic", "--json", "--no-live", *args,
                      runs_dir=runs_dir, check=True)
    doc = json.loads(cp.stdout)
    return doc, json.loads((Path(doc["run_dir"]) / "run.json").read_text())


def test_windowed_run_records_windows_and_closes(runs_dir):
    # 2 windows of 1 s (0.5 .. 1.5 and 2.5 .. 3.5 s) in a 5 s run at 1 client (latency-bound: the latency view is
    # the one that must close)
    doc, meta = _run(runs_dir, "--clients", "1", "--duration", "5", "--probe-window", "1", "--probe-period", "2")
    p = meta["probes"]
    assert len(p["windows"]) == 2, p["windows"]
    # the doctor's capabilities the run passed its gate with (docs/INTERNALS.md: run.json probes.capabilities)
    caps = {c["name"]: c["ok"] for c in p["capabilities"]}
    assert caps["root"] and caps["btf"] and caps["tracepoint sched_switch"] and caps["tp_btf"], caps
    for w in p["windows"]:
        assert w["attach_mono_ns"] <= w["start_mono_ns"] < w["end_mono_ns"] <= w["detached_mono_ns"]
        assert w["start_realtime_ns"] < w["end_realtime_ns"] and 0 < w["busy_ns"] <= w["total_ns"]
        # the window ends on its schedule; it opens once its programs are attached, ~0.1 s late beside the other
        # lane (CI run 53: 0.894 s): its figures are divided by its own length, so only a window far off is wrong
        assert 0.75e9 < w["elapsed_ns"] < 1.2e9
    i, o = p["in_windows"], p["outside_windows"]
    assert p["log_clock"] == "realtime"
    # in, out and the edges (programs attached before a window opens, detached after it closes) part the run
    e = p["edges"]
    assert i["txns"] > 0 and o["txns"] > 0 and i["txns"] + o["txns"] + e["txns"] <= doc["transactions"], (i, o, e)
    assert 1.5 < i["duration_s"] <= 2.4 and 0 < e["duration_s"] < 2 * (pw.PREPARE_LEAD_S + 0.5), (i, e)
    assert i["busy_ns"] == sum(w["busy_ns"] for w in p["windows"])
    names = {s["name"] for s in doc["stages"]}
    assert {"wire.backend", "backend.execute", "wire.pgbench", "client.pgbench"} <= names
    # a one-namespace path has no device but lo, folded into the wire by default: its programs are not loaded
    assert "dev.lo" not in names and "pp_dev_xmit" not in p["cost"]["programs"]
    # bpf_stats only in a calibration slice of each window; the cost is scaled from the slices by messages
    cal = p["cost"]["calibration"]
    assert cal["slices"] == 2 and 0 < cal["slice_messages"] < cal["messages"]
    assert 0 < cal["slice_s"] < 2 * 1.0
    assert p["cost"]["programs"]["pp_sched_switch"]["ns_per_run"] > 0
    # divided by transactions in the windows: one backend.execute per transaction, not 1/duty of one
    ex = next(s for s in doc["stages"] if s["name"] == "backend.execute")
    assert 0.9 <= ex["count_per_txn"] <= 1.1, ex
    assert abs(doc["closure"]["latency_error_pct"]) <= 15, doc["closure"]
    assert doc["probe_overhead_pct"] is not None and doc["windows"]["count"] == 2
    assert doc["probe_cost_ns_per_txn"] > 0


def test_trace_sample_exports_valid_perfetto(runs_dir, tmp_path):
    from pathprof.analysis.export.files import validate_trace_events
    doc, meta = _run(runs_dir, "--clients", "2", "--duration", "2", "--trace-sample", "20")
    rd = Path(doc["run_dir"])
    assert (rd / "traces.parquet").exists()
    assert meta["probes"]["lost"].get("trace_lost", 0) == 0
    out = tmp_path / "trace.json"
    run_pathprof("export", str(rd), "--format", "perfetto", "-o", str(out), runs_dir=runs_dir, check=True)
    trace = json.loads(out.read_text())
    assert validate_trace_events(trace) == []
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(spans) > 10
    assert {"wire.backend", "backend.execute", "client.pgbench"} <= {e["name"] for e in spans}


def test_always_on_duty_100(runs_dir):
    doc, meta = _run(runs_dir, "--clients", "1", "--duration", "2", "--probe-duty", "100")
    p = meta["probes"]
    assert p["schedule"]["always_on"] and len(p["windows"]) == 1
    assert p["in_windows"]["txns"] >= 0.95 * doc["transactions"]
    assert p["cost"]["calibration"]["slices"] == 1
    # the probes' own time is a CPU component of its own; with no time outside windows there is no truth check
    assert "probes" in {c["component"] for c in doc["cpu"]}
    assert doc["prediction"]["measured_outside_tps"] is None and doc["prediction"]["unprobed_tps"] > 0
    assert abs(doc["closure"]["latency_error_pct"]) <= 15, doc["closure"]
