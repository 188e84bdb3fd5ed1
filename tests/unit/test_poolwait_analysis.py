"""The pooler-wait pieces that need no kernel: explanations where a queue moves inside one hop, the pooler's own
counters against the probes (Little's law), waterfall chains through a pooler, spec options for pool sizes and
the pgpool workloads that cannot run."""
import pandas as pd
import pytest
from fixtures_summaries import plus_stage, summary
from pathprof.analysis.explain import explain
from pathprof.analysis.pooler import describe, pooler_check
from pathprof.analysis.report.waterfall import transactions
from pathprof.errors import UserError
from pathprof.topologies import spec
from pathprof.topologies.services import create


def test_a_queue_moving_inside_the_pooler_is_the_pooler_s_gap():
    """poolwait up by more than the gap, queued.pgbouncer down: one cause, ranked, carrying the gap."""
    a = plus_stage(plus_stage(summary("pgbouncer"), "hop.pgbouncer", 5.0), "queued.pgbouncer", 110.0)
    b = plus_stage(plus_stage(a, "poolwait.pgbouncer", 318.0), "queued.pgbouncer", -110.0, tps=40000.0)
    e = explain(a, b)
    assert e["ranked"], e["verdict"]
    assert e["causes"][0]["name"] == "hop pgbouncer"
    assert e["causes"][0]["share_pct"] == pytest.approx(100.0, abs=0.5)


def test_unrelated_items_that_cancel_are_still_not_ranked():
    a = summary("pgbouncer")
    b = plus_stage(plus_stage(a, "backend.execute", 300.0), "client.pgbench", -290.0, tps=60000.0)
    assert explain(a, b)["verdict"] == "smaller than its parts"


def _meta(samples, windows=None, always_on=True):
    return {"pooler_counters": {"pgbouncer": {"source": "pgbouncer admin console (SHOW POOLS)",
                                              "samples": samples}},
            "probes": {"windows": windows or [], "schedule": {"always_on": always_on}}}


def test_littles_law_expectation_from_tps_and_poolwait():
    s = {"tps": 20000.0, "stages": [{"name": "poolwait.pgbouncer", "leg": "request", "us_per_txn": 500.0}]}
    samples = [{"mono_ns": i, "cl_waiting": w, "maxwait_us": 1500} for i, w in enumerate((9, 10, 11, 10))]
    (row,) = pooler_check(_meta(samples), s)
    assert row["expected_waiting"] == pytest.approx(10.0)        # 20,000/s x 500 µs
    assert row["cl_waiting_mean"] == 10.0 and row["cl_waiting_max"] == 11 and row["maxwait_ms"] == 1.5
    assert "predicts 10.00" in describe(row)


def test_only_samples_inside_the_windows_count_when_windowed():
    s = {"tps": 1.0, "windows": {"tps_in": 20000.0},
         "stages": [{"name": "poolwait.pgbouncer", "leg": "request", "us_per_txn": 100.0}]}
    samples = [{"mono_ns": 5, "cl_waiting": 2}, {"mono_ns": 50, "cl_waiting": 100}]
    (row,) = pooler_check(_meta(samples, [{"start_mono_ns": 0, "end_mono_ns": 10}], always_on=False), s)
    assert row["samples"] == 1 and row["cl_waiting_mean"] == 2 and row["expected_waiting"] == pytest.approx(2.0)


def test_a_console_that_refused_is_said_so():
    meta = _meta([])
    meta["pooler_counters"]["pgbouncer"]["error"] = "OperationalError: no such user"
    (row,) = pooler_check(meta, {"tps": 1.0, "stages": []})
    assert "could not be read" in describe(row)


def _span(ts, dur, stage, role, leg, txn, pid=1):
    return {"ts_ns": ts, "dur_ns": dur, "stage": stage, "role": role, "leg": leg, "txn": txn, "pid": pid,
            "tid": pid}


def test_two_transactions_starting_at_one_instant_are_not_chained_together():
    """A pooler's response to one client and its forward of another client's held request can start at the same
    nanosecond: the chain follows the transaction number, and says which backend served each."""
    rows = [_span(0, 10, "wire.pgbouncer", "pgbouncer", "request", 7),
            _span(10, 5, "poolwait.pgbouncer", "pgbouncer", "request", 7),
            _span(15, 5, "hop.pgbouncer", "pgbouncer", "request", 7),
            _span(20, 10, "backend.execute", "backend", "server", 7, pid=42),
            _span(30, 5, "hop.pgbouncer", "pgbouncer", "response", 7),
            _span(35, 5, "client.pgbench", "pgbench", "client", 7),
            _span(30, 5, "hop.pgbouncer", "pgbouncer", "request", 3),      # another client's, same start
            _span(35, 10, "backend.execute", "backend", "server", 3, pid=43)]
    (t,) = transactions(pd.DataFrame(rows))
    assert [s["stage"] for s in t["spans"]][-1] == "client.pgbench" and t["backend_pid"] == 42


def test_pool_size_is_a_topology_option():
    topo = spec.load("pgbouncer", {"pool_mode": "transaction", "pool_size": "3"})
    assert create(topo.services[0]).opts["pool_size"] == 3
    with pytest.raises(UserError, match="whole number"):
        spec.load("pgbouncer", {"pool_size": "three"})


def test_pgpool_with_fewer_children_than_clients_refuses_what_would_hang():
    svc = create(spec.load("pgpool", {"children": "2"}).services[0])
    with pytest.raises(UserError, match="--connect"):
        svc.check_workload("prepared", False, clients=4, threads=2)
    with pytest.raises(UserError, match="--threads 4"):
        svc.check_workload("prepared", True, clients=4, threads=2)
    svc.check_workload("prepared", True, clients=4, threads=4)      # one client per thread: it runs
    svc.check_workload("prepared", False, clients=2, threads=2)     # enough children
