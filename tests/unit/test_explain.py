"""Explanations on synthetic summaries whose right answer is known by construction."""
import copy

import pytest
from fixtures_summaries import BASE_CPU, BASE_STAGES, bridge, connect_run, dnat, long_conn_run, plus_stage, summary
from pathprof.analysis.explain import explain, explain_text, measured_cpu_us
from pathprof.analysis.host_diff import host_differences
from pathprof.analysis.repeats import is_real_gap, spread


def test_one_stage_slower_ranks_first_with_full_share():
    a = summary("loopback")
    b = plus_stage(a, "recv.backend", 5.0, topology="nic", tps=60000.0)
    e = explain(a, b)
    assert e["basis"] == "latency"
    assert e["run"] == "nic"
    assert e["items"][0]["name"] == "recv.backend"
    assert e["items"][0]["delta_us_per_txn"] == pytest.approx(5.0)
    assert e["items"][0]["share_pct"] == pytest.approx(100.0, abs=0.1)
    assert e["unexplained_pct"] == pytest.approx(0.0, abs=0.1)
    assert e["tps_delta_pct"] == pytest.approx((60000 - 64765) / 64765 * 100, abs=0.05)


def test_gap_split_three_to_one():
    a = summary("loopback")
    b = plus_stage(plus_stage(a, "runqueue.backend", 6.0), "netfilter.output", 2.0, topology="nic", tps=60000.0)
    items = {it["name"]: it["share_pct"] for it in explain(a, b)["items"]}
    assert items["runqueue.backend"] == pytest.approx(75.0, abs=0.1)
    assert items["netfilter.output"] == pytest.approx(25.0, abs=0.1)
    assert [it["name"] for it in explain(a, b)["items"][:2]] == ["runqueue.backend", "netfilter.output"]


def test_stage_present_in_one_run_counts_fully():
    a = summary("docker-bridge")
    b = plus_stage(a, "hop.docker-proxy", 20.0, topology="docker-dnat", tps=40000.0)
    e = explain(a, b)
    assert e["items"][0] == {"name": "hop.docker-proxy", "delta_us_per_txn": 20.0, "share_pct": 100.0}
    # and the reverse direction: the stage vanished, the gap is negative, the share is still 100 %
    r = explain(b, a)
    assert r["items"][0]["name"] == "hop.docker-proxy"
    assert r["items"][0]["delta_us_per_txn"] == -20.0
    assert r["items"][0]["share_pct"] == 100.0


def test_unexplained_is_the_part_items_do_not_cover():
    a = summary("loopback")
    b = plus_stage(a, "recv.backend", 8.0, topology="nic", tps=60000.0)
    b["latency_ms"]["mean"] += 0.002            # 2 µs of measured latency that no stage saw
    e = explain(a, b)
    assert e["items"][0]["share_pct"] == pytest.approx(80.0, abs=0.1)
    assert e["unexplained_pct"] == pytest.approx(20.0, abs=0.1)


def test_cpu_bound_uses_cpu_components():
    e = explain(bridge(), dnat())
    assert e["basis"] == "cpu"
    names = [it["name"] for it in e["items"]]
    assert names[:3] == ["hop.docker-proxy", "softirq.net", "netfilter"]
    assert "runqueue.backend" not in names          # a latency stage, not a CPU component
    assert e["gap_us_per_txn"] == pytest.approx(45.4, abs=0.01)
    assert e["items"][0]["share_pct"] == pytest.approx(40.0 / 45.4 * 100, abs=0.1)
    assert e["unexplained_pct"] == pytest.approx(0.4 / 45.4 * 100, abs=0.1)


def test_basis_is_cpu_only_when_both_runs_are_limited_by_their_own_cpu():
    a, b = summary("a"), summary("b", regime="cpu-bound", tps=50000.0)
    assert explain(b, summary("c", regime="cpu-bound", tps=40000.0))["basis"] == "cpu"
    # limited by different things (one latency-bound, one by CPU): the latency basis, and the reason says so
    e = explain(a, b)
    assert e["basis"] == "latency" and "limited by different things" in e["basis_reason"]
    assert explain(b, a)["basis"] == "latency"
    assert explain(a, summary("c", tps=50000.0))["basis"] == "latency"


def test_foreign_cpu_load_is_not_the_run_being_cpu_bound():
    """The issue's case: a 1-client run alone (latency-bound) against the same run with two busy loops on both
    CPUs (saturated, mostly by `other`, and faster because the CPUs never idle). Explained on the latency
    basis, where the wakeups that stopped waiting for idle CPUs carry the gap; no share beyond ±150 %."""
    alone = summary("nic", clients=1, tps=8300.0, stages={"idle_exit.backend": 24.4, "idle_exit.pgbench": 24.7,
                                                           "wire.backend": 20.0, "backend.execute": 30.0,
                                                           "wire.pgbench": 21.4})
    busy_cpu = dict(BASE_CPU, other=60.0)
    loaded = summary("nic", clients=1, tps=24400.0, regime="cpu-bound", cpu=busy_cpu,
                     stages={"wakeup.backend": 1.2, "wakeup.pgbench": 1.7, "wire.backend": 3.0,
                             "backend.execute": 30.0, "wire.pgbench": 5.1}, run_dir="runs/x-loaded")
    e = explain(alone, loaded)
    assert e["basis"] == "latency" and "other processes' CPU load" in e["basis_reason"]
    assert e["ranked"] and all(abs(r["share_pct"]) <= 150 for r in (*e["items"], *e["causes"]))
    assert e["causes"][0]["name"] == "scheduler"
    assert {"idle_exit.backend", "idle_exit.pgbench"} <= set(e["causes"][0]["items"])


def test_a_gap_smaller_than_its_parts_is_not_ranked():
    a = summary("loopback", regime="cpu-bound")
    cpu = dict(BASE_CPU, backend=BASE_CPU["backend"] + 20.0, pgbench=BASE_CPU["pgbench"] - 19.0)   # +1 µs net
    b = summary("nic", regime="cpu-bound", cpu=cpu, tps=60000.0,
                stages=dict((k, v) for k, v in BASE_STAGES.items()))
    b["stages"][0]["us_per_txn"] += 40.0           # the latency view cannot split it cleanly either
    b["stages"][1]["us_per_txn"] -= 39.0
    b["latency_ms"]["mean"] += 0.001
    e = explain(a, b)
    assert e["ranked"] is False and e["verdict"] == "smaller than its parts"
    assert all(r["share_pct"] is None for r in e["items"]) and e["unexplained_pct"] is None
    assert abs(e["items"][0]["delta_us_per_txn"]) >= abs(e["items"][-1]["delta_us_per_txn"])
    assert "smaller than its parts" in explain_text(e)


def test_a_gap_within_noise_is_said_so():
    a = summary("loopback")
    b = plus_stage(a, "recv.backend", 1.0, topology="nic", tps=63000.0)       # -2.7 % TPS, single runs
    e = explain(a, b)
    assert e["verdict"] == "within noise" and not e["ranked"]
    assert "not ranked" in explain_text(e)
    # with repeats that show the gap is real, the caller turns the single-run noise rule off
    assert explain(a, b, noise_pct=0.0)["ranked"]


def test_a_gap_pointing_against_the_tps_change_is_noise():
    a = summary("loopback")
    b = plus_stage(a, "recv.backend", -4.0, topology="nic", tps=58000.0)   # 10 % slower, yet 4 µs cheaper
    e = explain(a, b)
    assert e["verdict"] == "within noise" and "points the other way" in explain_text(e)


def test_measured_cpu_prefers_busy_time():
    s = summary(cpu=dict(BASE_CPU), tps=50000.0)
    s["busy_cpus"] = 2.0
    assert measured_cpu_us(s) == pytest.approx(40.0)
    s.pop("busy_cpus")
    s["closure"]["cpu_error_pct"] = 3.0
    assert measured_cpu_us(s) == pytest.approx(30.9 / 1.03)


def test_sparse_summaries_do_not_raise():
    e = explain({"topology": "a", "tps": 100}, {"topology": "b", "tps": 50, "latency_ms": {"mean": 1.0}})
    assert e["items"] == [] and e["unexplained_pct"] == 100.0
    assert "50 % slower" in explain_text(e)
    assert explain({}, {})["tps_delta_pct"] == 0.0


def test_sentence_reads_like_the_issue():
    e = explain(bridge(), dnat())
    text = explain_text(e)
    # causes first: the hop only one path has takes the extra kernel network work of its second connection
    assert text == ("docker-dnat is 60 % slower than docker-bridge; the docker-proxy hop (with the network work "
                    "of its second connection) causes 99 % of that (+45.0 µs CPU per transaction: "
                    "hop.docker-proxy +40.0, softirq.net +3.5, netfilter +1.5), 0.9 % unexplained")
    cause = e["causes"][0]
    assert cause["name"] == "hop docker-proxy" and cause["share_pct"] == pytest.approx(45.0 / 45.4 * 100, abs=0.1)
    assert set(cause["items"]) == {"hop.docker-proxy", "softirq.net", "netfilter"}


def test_sentence_for_equal_runs_and_faster_runs():
    a = summary("loopback")
    assert "no gap to explain" in explain_text(explain(a, copy.deepcopy(a)))
    faster = plus_stage(a, "recv.backend", -2.0, topology="unix", tps=70000.0)
    text = explain_text(explain(a, faster))
    assert text.startswith("unix is 8 % faster than loopback; the scheduler causes 100 % of that (-2.0 µs")
    assert "-0 %" not in text


def test_host_differences_lists_machine_facts():
    a = summary("x")
    b = summary("x", host={"kernel": "6.1.0", "cpus": 8, "hostname": "vm1"}, pathprof_version="0.2.0",
                postgres_version="16.4", accelerator="tcg")
    diffs = host_differences(a, b)
    assert diffs[0] == "kernel: 6.18.0 → 6.1.0"
    assert "CPUs: 2 → 8" in diffs
    assert "pathprof version: unknown → 0.2.0" in diffs
    assert "PostgreSQL version: unknown → 16.4" in diffs
    assert "accelerator: unknown → tcg" in diffs
    assert host_differences(a, copy.deepcopy(a)) == []


def test_spread_and_real_gap():
    runs = [summary(tps=t) for t in (100.0, 110.0, 105.0)]
    sp = spread(runs)
    assert sp == {"n": 3, "mean": 105.0, "min": 100.0, "max": 110.0, "stdev": pytest.approx(5.0)}
    assert spread([summary(tps=7.0)])["stdev"] == 0.0
    assert is_real_gap(runs, [summary(tps=t) for t in (150.0, 155.0)])
    assert not is_real_gap(runs, [summary(tps=t) for t in (108.0, 115.0)])       # ranges overlap: noise
    assert not is_real_gap(runs[:1], [summary(tps=200.0)])                       # one run each: not shown


def test_sentence_mentions_noise_when_repeats_say_so():
    e = explain(bridge(), dnat())
    assert "spread" not in explain_text(e)
    assert explain_text(dict(e, real_gap=True)).endswith("(the gap exceeds the run-to-run spread)")
    assert "treat it as noise" in explain_text(dict(e, real_gap=False))


def test_new_connection_per_transaction_is_explained_by_connection_setup():
    e = explain(long_conn_run(), connect_run())
    assert e["basis"] == "latency" and e["measure"] == "client_cycle_us"
    assert e["tps_delta_pct"] == pytest.approx(-99.0, abs=0.1)
    assert e["gap_us_per_txn"] == pytest.approx(3030.0 - 30.1, abs=0.01)
    assert [it["name"] for it in e["items"][:3]] == ["connect.backend.start", "connect.postmaster.fork",
                                                      "connect.auth"]
    assert e["items"][0]["share_pct"] == pytest.approx(1400 / 2999.9 * 100, abs=0.1)
    assert e["unexplained_pct"] == pytest.approx(229.9 / 2999.9 * 100, abs=0.1)
    text = explain_text(e)
    assert text.startswith("unix (new connection per transaction) is 99 % slower than unix; connection setup "
                           "causes 92 % of that (+2,770.0 µs per transaction: connect.backend.start +1,400.0, "
                           "connect.postmaster.fork +950.0, connect.auth +300.0)")


def _deep(wal_flush: float, other: float, tps: float, regime: str = "latency-bound", cpu: dict | None = None) -> dict:
    """A deep tpcb-like summary: backend.execute with its exclusive parts (wal_flush, lock_wait, other)."""
    doc = summary("loopback", clients=4, tps=tps, regime=regime, cpu=cpu,
                  stages={"wire.backend": 20.0, "runqueue.backend": 60.0, "wire.pgbench": 25.0,
                          "backend.execute": wal_flush + 100.0 + other})
    doc["stages"] += [{"name": "backend.wal_flush", "leg": "server", "us_per_txn": wal_flush, "parent":
                       "backend.execute", "part": True, "inclusive_us": wal_flush},
                      {"name": "backend.lock_wait", "leg": "server", "us_per_txn": 100.0, "parent": "backend.execute",
                       "part": True, "inclusive_us": 100.0},
                      {"name": "backend.execute.other", "leg": "server", "us_per_txn": other,
                       "parent": "backend.execute", "part": True},
                      {"name": "backend.executor", "leg": "server", "us_per_txn": 400.0, "parent": "backend.execute",
                       "phase": True}]
    return doc


def test_a_gap_inside_the_server_is_named_by_its_io_stage():
    """fsync off: the commit's WAL flush goes (2,400 -> 10 µs); backend.execute is split into its exclusive parts,
    so the item is backend.wal_flush and the cause the server's I/O, not `the backend` as one block."""
    on, off = _deep(2400.0, 300.0, tps=1400.0), _deep(10.0, 290.0, tps=9500.0)
    e = explain(on, off)
    assert e["basis"] == "latency"
    assert e["items"][0]["name"] == "backend.wal_flush"
    assert e["causes"][0]["name"] == "backend I/O" and e["causes"][0]["share_pct"] > 90
    assert "backend.execute" not in {it["name"] for it in e["items"]}
    assert "backend.executor" not in {it["name"] for it in e["items"]}        # a phase: never an item
    assert "the server's I/O causes" in explain_text(e)


def test_cpu_bound_runs_still_name_the_io_waits_that_moved():
    """Both runs CPU-bound: the basis stays CPU (other clients' work filled the fsync waits), and the sentence adds
    the I/O stages' moves from the latency view."""
    cpu_on = dict(BASE_CPU, backend=BASE_CPU["backend"] + 60.0)
    on = _deep(2400.0, 300.0, tps=2400.0, regime="cpu-bound", cpu=cpu_on)
    off = _deep(10.0, 290.0, tps=3600.0, regime="cpu-bound")
    e = explain(on, off)
    assert e["basis"] == "cpu"
    assert e["io_stages"][0]["name"] == "backend.wal_flush"
    assert e["io_stages"][0]["delta_us_per_txn"] == pytest.approx(-2390.0)
    assert "backend.wal_flush -2,390.0" in explain_text(e)


def test_a_reply_waiting_for_a_thread_blocked_in_a_connect_is_connection_setup():
    from pathprof.analysis.causes import cause_of
    assert cause_of("connwait.pgbench", set()) == "connection setup"
    assert cause_of("connect.thread_wait", set()) == "connection setup"
    assert cause_of("wakeup.pgbench", set()) == "scheduler"


def test_a_handshake_waiting_for_a_retransmission_is_packet_loss():
    from pathprof.analysis.causes import cause_of
    assert cause_of("connect.syn_retx", set()) == "packet loss"
    assert cause_of("connect.synack_retx", set()) == "packet loss"
    assert cause_of("connect.setup_retx", set()) == "packet loss"
    assert cause_of("connect.tcp_handshake", set()) == "connection setup"


def test_a_part_one_run_lacks_is_zero_there_not_a_fallback_to_the_parent():
    """A deep baseline whose backend never waited has no backend.execute split; the other run's lock wait must
    still be named (#22.5), not folded into backend.execute for both."""
    a = plus_stage(summary("loopback"), "backend.execute", 0.0)
    a["probes"] = "deep"
    b = copy.deepcopy(a)
    b["tps"] = 20000.0
    for st in b["stages"]:
        if st["name"] == "backend.execute":
            st["us_per_txn"] += 9000.0
    b["stages"] += [{"name": "backend.lock_wait", "leg": "server", "us_per_txn": 8946.0, "parent": "backend.execute",
                     "part": True},
                    {"name": "backend.execute.other", "leg": "server", "parent": "backend.execute", "part": True,
                     "us_per_txn": [s for s in b["stages"] if s["name"] == "backend.execute"][0]["us_per_txn"]
                     - 8946.0}]
    b["latency_ms"]["mean"] += 9.0
    e = explain(a, b)
    assert e["items"][0]["name"] == "backend.lock_wait", e["items"][:3]
    assert e["items"][0]["delta_us_per_txn"] == pytest.approx(8946.0)
    assert "backend.execute" not in {i["name"] for i in e["items"]}
    # a basic baseline measured no parts: nothing is assumed, the parent is compared
    a["probes"] = "basic"
    assert explain(a, b)["items"][0]["name"] == "backend.execute"
