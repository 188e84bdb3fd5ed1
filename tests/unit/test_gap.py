"""Where the time in no stage is: the link of the message chain that falls short of its neighbours is named."""
from pathprof.analysis.gap import locate_gap
from pathprof.analysis.report.render import render_to_string, report_view


def st(name, leg, us, count):
    return {"name": name, "leg": leg, "us_per_txn": us, "count_per_txn": count}


def chain(hop_count: float) -> list[dict]:
    return [st("wire.pgbouncer", "request", 3, 1.0), st("queued.pgbouncer", "request", 40, 1.0),
            st("hop.pgbouncer", "request", 5, hop_count), st("wire.backend", "request", 3, 1.0),
            st("wakeup.backend", "request", 5, 1.0), st("runqueue.backend", "request", 5, 1.0),
            st("recv.backend", "request", 2, 1.0), st("backend.execute", "server", 10, 1.0),
            st("client.pgbench", "client", 6, 1.0)]


def test_a_view_that_closes_needs_no_location():
    assert locate_gap({"closure": {"latency_error_pct": -2.0, "cycle_us": 100.0}, "stages": chain(1.0)}) is None


def test_the_broken_link_is_named_with_its_leg_and_counts():
    s = {"closure": {"latency_error_pct": -60.0, "cycle_us": 1000.0}, "stages": chain(0.3),
         "losses": [{"name": "proc_unpaired", "count": 700}]}
    g = locate_gap(s)
    assert (g["leg"], g["receiver"], g["link"]) == ("request", "pgbouncer", "processing")
    assert g["short_us_per_txn"] == 600.0 and g["count_per_txn"] == 0.3 and g["expected_per_txn"] == 1.0
    assert "proc_unpaired" in g["evidence"]
    s["closure"]["gap"] = g
    text = render_to_string(report_view({"topology": "t", "clients": 1, "tps": 1.0, **s}))
    assert "600.0 µs per transaction in no stage" in text and "request leg" in text


def test_no_broken_link_is_said_so():
    g = locate_gap({"closure": {"latency_error_pct": -20.0, "cycle_us": 100.0}, "stages": chain(1.0)})
    assert g["leg"] is None and "not a broken chain" in g["statement"]


def test_more_than_the_cycle_is_not_called_short():
    g = locate_gap({"closure": {"latency_error_pct": 12.0, "cycle_us": 100.0}, "stages": chain(1.0)})
    assert g["short_us_per_txn"] < 0 and "more than the cycle" in g["statement"]
