"""The pooler-wait pieces that need no kernel: explanations where a queue moves inside one hop, the pooler's own
counters against the probes (Little's law), waterfall chains through a pooler, spec options for pool sizes and
the pgpool workloads that cannot run."""
import os

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


def test_the_pooler_s_own_timer_decides_where_it_keeps_one():
    """pgbouncer times its clients' waits (SHOW STATS): that clock, not the sampled count of waiting clients, is
    what the probes' poolwait is checked against. Per window: a run's pauses between windows are not in it."""
    s = {"tps": 1.0, "windows": {"tps_in": 20000.0},
         "stages": [{"name": "poolwait.pgbouncer", "leg": "request", "us_per_txn": 400.0}]}
    # the count says 6 of the 8 expected (statement mode's SHOW POOLS), the timer says 410 µs per transaction
    inside = [{"mono_ns": 0, "cl_waiting": 6, "wait_us_total": 0, "xacts_total": 0},
              {"mono_ns": 10, "cl_waiting": 6, "wait_us_total": 410_000, "xacts_total": 1000},
              {"mono_ns": 20, "cl_waiting": 6, "wait_us_total": 500_000_000, "xacts_total": 1001},  # between
              {"mono_ns": 30, "cl_waiting": 6, "wait_us_total": 500_000_000, "xacts_total": 1001},
              {"mono_ns": 40, "cl_waiting": 6, "wait_us_total": 500_820_000, "xacts_total": 3001}]
    windows = [{"start_mono_ns": 0, "end_mono_ns": 10}, {"start_mono_ns": 30, "end_mono_ns": 40}]
    (row,) = pooler_check(_meta(inside, windows, always_on=False), s)
    assert row["timed_wait_us_per_txn"] == pytest.approx(410.0) and row["timed_txns"] == 3000
    assert row["agrees"] is True
    assert "own timer: 410 µs" in describe(row) and "agrees" in describe(row)
    s["stages"][0]["us_per_txn"] = 200.0      # the probes' half of it: the timer says so, whatever the count
    (row,) = pooler_check(_meta(inside, windows, always_on=False), s)
    assert row["agrees"] is False and "DISAGREES" in describe(row)


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


def _pool_row(pid, status, count, backend="0", connected="0"):
    return {"pool_pid": pid, "pool_id": "0", "status": status, "client_connection_count": count,
            "pool_backendpid": backend, "pool_connected": connected, "pool_counter": "0"}


def test_pgpool_s_own_child_is_left_out_and_a_child_in_a_session_is_busy():
    from pathprof.topologies.services.pgpool import pool_usage
    rows = [_pool_row("10", "Execute command", "1", backend="77", connected="1"),     # pathprof's own child
            _pool_row("11", "Idle", "40", backend="78", connected="1"),
            _pool_row("12", "Wait for connection", "35")]
    busy, served = pool_usage(rows, "77")
    assert busy == {"11": True, "12": False} and served == 75
    # pgpool before 4.3 has no status: pool_connected says it, pool_counter counts per slot
    old = [{k: v for k, v in r.items() if k not in ("status", "client_connection_count")} for r in rows]
    old[1]["pool_counter"] = "5"
    assert pool_usage(old, "77") == ({"11": True, "12": False}, 5)


def test_accept_queue_is_the_listening_socket_s_rx_queue(tmp_path, monkeypatch):
    from pathprof.topologies.services import pgpool
    net = tmp_path / "net"
    net.mkdir()
    time_wait = "".join(f"  {i}: 0100007F:270F 0100007F:{i:04X} 06 00000000:00000000 03:00000000 00000000 0 0 0 1\n"
                        for i in range(3, 3000))      # a -C run's TIME_WAITs: more than one read of the file
    (net / "tcp").write_text(
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
        "   0: 0100007F:270F 00000000:0000 0A 00000000:00000003 00:00000000 00000000   106        0 1 1\n"
        "   1: 0100007F:1538 00000000:0000 0A 00000000:00000009 00:00000000 00000000   106        0 2 1\n"
        "   2: 0100007F:270F 0100007F:D431 01 00000000:00000005 00:00000000 00000000   106        0 3 1\n" + time_wait)
    (net / "tcp6").write_text(
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
        "   0: 00000000000000000000000001000000:270F 00000000000000000000000000000000:0000 0A 00000000:00000002 "
        "00:00000000 00000000 106 0 4 1\n")
    real_open, reads = os.open, []
    real_read = os.read
    monkeypatch.setattr(pgpool.os, "open", lambda p, *a: real_open(str(p).replace("/proc/42/net", str(net)), *a))
    monkeypatch.setattr(pgpool.os, "read", lambda fd, n: reads.append(n) or real_read(fd, n))
    assert pgpool.accept_queue(42, 9999) == 3 + 2        # the listeners on 9999 only, not their connections
    assert len(reads) == 1 + 2      # tcp (300 KB): one, it stops after the listeners; tcp6: its lines, then the end
    assert pgpool.accept_queue(43, 9999) == 0            # no such process: nothing waiting


def _pgpool_meta(samples, services=1):
    return {"pooler_counters": {"pgpool": {"source": "SHOW POOL_POOLS", "servers_are": "child",
                                           "samples": samples}},
            "services": [{"kind": "pgpool", "hop": "pgpool"}] * services,
            "probes": {"windows": [], "schedule": {"always_on": True}}}


def _connect_summary(tps, hop_accept_us):
    return {"tps": tps, "clients": 4,
            "stages": [{"name": "connect.hop_accept", "leg": "connect", "us_per_txn": hop_accept_us},
                       {"name": "poolwait.pgpool", "leg": "request", "us_per_txn": 0.0}]}


def test_a_child_s_accept_queue_is_checked_against_connect_hop_accept():
    """pgpool, one child, three clients queued: Little's law with the hop's accept wait (per connection = per
    transaction under -C); the same figures with the wait a tenth of it disagree, and say so."""
    samples = [{"mono_ns": i * 10**9, "cl_waiting": w, "servers": 1, "servers_busy": 1, "served": 300 * i}
               for i, w in enumerate((3, 3, 2, 3))]
    (row,) = pooler_check(_pgpool_meta(samples), _connect_summary(300.0, 9000.0))
    assert row["wait_stages"] == {"poolwait.pgpool": 0.0, "connect.hop_accept": 9000.0}
    assert row["expected_waiting"] == pytest.approx(2.7) and row["cl_waiting_mean"] == 2.75 and row["agrees"]
    assert row["servers_busy_mean"] == 1.0 and row["connections_per_s"] == 300.0 and not row["no_wait"]
    line = describe(row)
    assert "1.00 of 1 children" in line and "waiting for a child 2.75" in line and ": agrees" in line
    assert row["waiting_pct"] == 68.8 and "Clients wait for a child: 68.8 % of their time" in line
    (off,) = pooler_check(_pgpool_meta(samples), _connect_summary(300.0, 900.0))
    assert not off["agrees"] and "DISAGREES" in describe(off)
    # on a path with several hops the accept queue is every hop's: not this hop's wait alone
    (two,) = pooler_check(_pgpool_meta(samples, services=2), _connect_summary(300.0, 9000.0))
    assert two["wait_stages"] == {"poolwait.pgpool": 0.0}


def test_enough_children_say_no_client_waits():
    samples = [{"mono_ns": i, "cl_waiting": 0, "servers": 8, "servers_busy": 2} for i in range(10)]
    (row,) = pooler_check(_pgpool_meta(samples), _connect_summary(500.0, 60.0))
    assert row["no_wait"] and row["agrees"] and "No client waits for a child: 0.0 %" in describe(row)
    # fewer children than clients: a tenth of the clients' time in the queue is a wait, whatever the pooler's count
    # of busy children
    fewer = [dict(s, cl_waiting=1, servers=3) for s in samples]
    (row,) = pooler_check(_pgpool_meta(fewer), _connect_summary(500.0, 800.0))
    assert not row["no_wait"] and row["waiting_pct"] == 25.0 and row["expected_waiting_pct"] == 10.0
    assert "Clients wait for a child: 25.0 %" in describe(row)
    # as many children as clients or more: one is free for each, the queue is pgpool's own accept
    (row,) = pooler_check(_pgpool_meta([dict(s, cl_waiting=1) for s in samples]), _connect_summary(500.0, 800.0))
    assert row["no_wait"] and row["enough_servers"] and row["waiting_pct"] == 25.0
    assert "No client waits for a child (8 for the run's clients)" in describe(row)
    assert "pgpool's own accept" in describe(row)


def _through_pooler(t0, txn, backend, pooler_pid=9):
    return [_span(t0, 10, "wire.pgbouncer", "pgbouncer", "request", txn, pid=5),       # sent by pgbench (pid 5)
            _span(t0 + 10, 5, "poolwait.pgbouncer", "pgbouncer", "request", txn, pid=pooler_pid),
            _span(t0 + 15, 5, "hop.pgbouncer", "pgbouncer", "request", txn, pid=pooler_pid),
            _span(t0 + 20, 10, "backend.execute", "backend", "server", txn, pid=backend),
            _span(t0 + 30, 5, "hop.pgbouncer", "pgbouncer", "response", txn, pid=pooler_pid),
            _span(t0 + 35, 5, "client.pgbench", "pgbench", "client", txn, pid=5)]


def test_the_report_says_which_backend_served_which_transaction():
    """Transaction pooling: one pgbouncer process, three transactions, two server connections; each transaction's
    number with its backend and the pooler process it went through (not pgbench's pid on the wire span)."""
    from pathprof.analysis.served import describe as served_line
    from pathprof.analysis.served import served_by
    rows = _through_pooler(0, 7, 42) + _through_pooler(100, 8, 43) + _through_pooler(200, 9, 42)
    doc = served_by(pd.DataFrame(rows))
    assert doc["transactions"] == 3
    assert doc["backends"] == [{"pid": 42, "transactions": 2, "via": {"pgbouncer": [9]}},
                               {"pid": 43, "transactions": 1, "via": {"pgbouncer": [9]}}]
    assert [(x["txn"], x["backend_pid"], x["via"]) for x in doc["listed"]] == [
        (7, 42, {"pgbouncer": 9}), (8, 43, {"pgbouncer": 9}), (9, 42, {"pgbouncer": 9})]
    assert "served by 2 backend(s): 42 67 % via pgbouncer 9, 43 33 %" in served_line(doc)
    assert served_by(pd.DataFrame(rows[:3])) is None          # no complete chain: nothing to say
