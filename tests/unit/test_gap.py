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


def _connect_run(thread_wait_divisor: int, txns: int = 789, err: float = -9.0) -> dict:
    """A -C run: 10,000 µs cycle, setup steps per connection over `txns` transactions; connect.thread_wait's mean
    over `thread_wait_divisor` connections (the old pgbouncer -C bug: over every connection of the run, 1,626,
    where the windows held 789)."""
    setup = [{"name": "connect.tcp_handshake", "us_per_conn": 300.0, "count": txns, "divisor": txns},
             {"name": "connect.thread_wait", "us_per_conn": 440.0, "count": txns, "divisor": thread_wait_divisor},
             {"name": "connect.fork", "us_per_conn": 250.0, "count": 780, "divisor": 780}]   # edge: within 5 %
    return {"closure": {"latency_error_pct": err, "cycle_us": 10000.0, "stages_sum_us": 10000.0 * (1 + err / 100),
                        "txns": txns}, "stages": chain(1.0), "connection_setup": setup}


def test_a_setup_step_divided_by_other_than_the_transactions_is_named():
    from pathprof.analysis.gap import connect_divisors
    d = connect_divisors(_connect_run(1626))
    (row,) = d["steps"]                               # connect.fork's 780 of 789 is a window edge, not a divisor
    assert row["step"] == "connect.thread_wait" and row["divisor"] == 1626
    assert row["us_per_txn_if_over_txns"] == round(440.0 * 1626 / 789, 1)
    assert d["shift_us_per_txn"] == round(440.0 * 1626 / 789 - 440.0, 1)            # +466.8 µs
    assert d["latency_error_pct_if_over_txns"] == -4.33 and d["decides_closure"]     # -9.0 % -> -4.3 %
    assert "whether this run closes depends on that divisor" in d["statement"]
    assert connect_divisors(_connect_run(789)) is None                               # the right divisor: silent
    assert connect_divisors(_connect_run(800)) is None                               # within window edges


def test_the_gap_locator_says_a_divisor_decides_the_closure():
    from pathprof.analysis.gap import connect_divisors
    s = _connect_run(1626)
    s["closure"]["connect_divisors"] = connect_divisors(s)
    g = locate_gap(s)
    assert g["leg"] == "connect" and g["link"] == "divisor" and "connect.thread_wait" in g["statement"]
    # closed but only thanks to a divisor: still said (not as a gap: the report's divisors line)
    closed = _connect_run(400, err=-4.0)             # a step over half the transactions: too large by 2x
    d = connect_divisors(closed)
    assert d["decides_closure"] and d["shift_us_per_txn"] < 0 and locate_gap(closed) is None
    closed["closure"]["connect_divisors"] = d
    text = render_to_string(report_view({"topology": "t", "clients": 1, "tps": 1.0, **closed}))
    assert "divisors" in text and "depends on that divisor" in text


def test_compare_says_how_much_of_the_explanation_rests_on_a_divisor():
    from pathprof.analysis.explain import explain, explain_text
    from pathprof.analysis.gap import connect_divisors
    a, b = _connect_run(789, err=-1.0), _connect_run(1626)
    for s, tps in ((a, 400.0), (b, 300.0)):
        s.update(topology="nic", clients=4, tps=tps, workload={"connect": True})
        s["closure"]["connect_divisors"] = connect_divisors(s)
    e = explain(a, b)
    (c,) = e["divisor_caveats"]
    assert c["steps"] == ["connect.thread_wait"] and c["shift_us_per_txn"] == 466.8
    assert "rests on a divisor" in explain_text(e)
