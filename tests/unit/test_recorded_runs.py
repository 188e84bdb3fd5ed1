"""Reports and explanations from run directories recorded by real runs (tests/unit/data/runs, checked in):
the same numbers every time, and the differences the paths really have."""
import json
import shutil
from pathlib import Path

import pytest
from pathprof.analysis.explain import explain, explain_text
from pathprof.analysis.report.render import render_to_string, report_view
from pathprof.analysis.rundir import RunDir
from pathprof.analysis.summary import summarize
from pathprof.errors import UserError

RUNS = Path(__file__).parent / "data" / "runs"


@pytest.fixture(scope="module")
def unix():
    return summarize(RunDir.open(RUNS / "unix"))


@pytest.fixture(scope="module")
def loopback():
    return summarize(RunDir.open(RUNS / "loopback"))


def test_summary_is_a_pure_function_of_the_run_directory(unix):
    again = summarize(RunDir.open(RUNS / "unix"))
    assert again == unix
    assert unix["topology"] == "unix" and unix["clients"] == 2 and unix["tps"] > 0


def raw(name: str) -> dict:
    return json.loads((RUNS / name / "run.json").read_text())


def test_recorded_views_close(unix, loopback):
    """Checked against what pgbench and the kernel measured (run.json), not against the summary's own sums:
    the stages tile a connection's cycle (clients / TPS) and the CPU components add up to the CPUs' busy time
    per transaction in the windows."""
    for s in (unix, loopback):
        m = raw(s["topology"])
        cycle_us = m["workload"]["clients"] * 1e6 / m["pgbench"]["result"]["tps"]
        stages = sum(x["us_per_txn"] for x in s["stages"] if not x.get("parent"))
        assert stages == pytest.approx(cycle_us, rel=0.02), (s["topology"], stages, cycle_us)
        w = m["probes"]["in_windows"]
        cpu = sum(c["us_per_txn"] for c in s["cpu"])
        assert cpu == pytest.approx(w["busy_ns"] / 1e3 / w["txns"], rel=0.02), (s["topology"], cpu)


def test_paths_have_the_stages_they_can_have(unix, loopback):
    u = {x["name"] for x in unix["stages"]}
    lo = {x["name"] for x in loopback["stages"]}
    assert not any(n.startswith(("netfilter.", "dev.")) for n in u)
    assert any(n.startswith("netfilter.") for n in lo) and "dev.lo" in lo
    assert {"backend.execute", "client.pgbench"} <= u & lo


def test_explanation_points_at_tcp_work(unix, loopback):
    """Both runs CPU-bound: the gap is the CPU per transaction the kernel measured less the probes' own (their
    bpf_stats), and its first item is the network softirq work TCP over loopback has and a unix socket has not."""
    e = explain(unix, loopback)
    assert (e["run"], e["basis"], e["ranked"]) == ("loopback", "cpu", True)

    def system_cpu_us(name):
        m = raw(name)["probes"]
        return (m["in_windows"]["busy_ns"] - m["cost"]["run_time_ns"]) / 1e3 / m["in_windows"]["txns"]
    per_txn = {n: system_cpu_us(n) for n in ("unix", "loopback")}
    assert e["gap_us_per_txn"] == pytest.approx(per_txn["loopback"] - per_txn["unix"], rel=0.03), per_txn
    cpu = {s["topology"]: {c["component"]: c["us_per_txn"] for c in s["cpu"]} for s in (unix, loopback)}
    assert e["items"][0]["name"] == "softirq.net" and "softirq.net" not in cpu["unix"], e["items"][0]
    for item in e["items"]:        # each item is the two runs' difference in that component, a share of the gap
        delta = cpu["loopback"].get(item["name"], 0.0) - cpu["unix"].get(item["name"], 0.0)
        assert item["delta_us_per_txn"] == pytest.approx(delta, abs=0.002), item
        assert item["share_pct"] == pytest.approx(100 * delta / e["gap_us_per_txn"], abs=0.1), item
    assert "loopback" in explain_text(e) and "unix" in explain_text(e)


def test_report_renders_recorded_run(loopback):
    text = render_to_string(report_view(loopback))
    assert "loopback" in text and "netfilter" in text and "closure" in text.lower()


def test_unknown_schema_and_corruption_are_refused(tmp_path):
    d = tmp_path / "r"
    shutil.copytree(RUNS / "unix", d)
    meta = json.loads((d / "run.json").read_text())
    meta["schema"] = "pathprof-run/2.0"
    (d / "run.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match="not supported"):
        RunDir.open(d)
    meta["schema"] = "pathprof-run/1.0"
    (d / "run.json").write_text(json.dumps(meta))
    (d / "stages.parquet").write_bytes(b"PAR1 truncated")
    with pytest.raises(UserError, match="corrupt"):
        summarize(RunDir.open(d))


def test_diff_across_kernels_lists_the_kernel_first(tmp_path):
    """Seed 002 stays offline: two runs recorded on different kernels. The diff names the kernel before any
    path difference and still explains the gap with the same stages."""
    from pathprof.analysis.host_diff import host_differences
    other = tmp_path / "loopback-on-3.10"
    shutil.copytree(RUNS / "loopback", other)
    meta = json.loads((other / "run.json").read_text())
    meta["host"]["kernel"] = "3.10.0-1160.el7.x86_64"
    meta["pgbench"]["result"]["tps"] *= 0.9                          # 10 % slower on the old kernel
    (other / "run.json").write_text(json.dumps(meta))
    a, b = summarize(RunDir.open(RUNS / "loopback")), summarize(RunDir.open(other))
    diffs = host_differences(a, b)
    assert diffs[0].startswith("kernel: ") and diffs[0].endswith("→ 3.10.0-1160.el7.x86_64"), diffs
    e = explain(a, b)
    assert e["tps_delta_pct"] == pytest.approx(-10.0, abs=0.1)
    assert {i["name"] for i in e["items"]} <= {s["name"] for s in a["stages"]} | {c["component"] for c in a["cpu"]}
