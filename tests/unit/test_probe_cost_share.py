"""The probes' cost is stated in the unit that limits the run (issue #20): CPU share when CPU-bound, cycle share
when latency-bound — never a share of mean latency on a CPU-bound run, which understates it."""
from pathprof.analysis.report.render import render_to_string, report_view
from pathprof.analysis.summary import probe_cost_share


def doc(regime):
    return {"regime": regime, "probe_cost_ns_per_txn": 12_000.0, "cpu_us_per_txn": 80.0,
            "closure": {"cycle_us": 600.0}, "latency_ms": {"mean": 0.6}}


def test_cpu_bound_cost_is_a_share_of_the_cpu():
    assert probe_cost_share(doc("cpu-bound")) == {"probe_cost_share_pct": 15.0, "probe_cost_share_of": "cpu"}


def test_latency_bound_cost_is_a_share_of_the_cycle():
    assert probe_cost_share(doc("latency-bound")) == {"probe_cost_share_pct": 2.0, "probe_cost_share_of": "cycle"}


def test_no_cost_no_share():
    assert probe_cost_share({"regime": "cpu-bound", "cpu_us_per_txn": 80.0}) == {}


def test_report_says_the_unit():
    s = {"topology": "t", "clients": 16, "tps": 1.0, **doc("cpu-bound"), **probe_cost_share(doc("cpu-bound"))}
    text = render_to_string(report_view(s))
    assert "15.00 % of the CPU per transaction" in text and "of mean latency" not in text
