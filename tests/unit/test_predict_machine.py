"""analysis.predict with the machine's costs (agent.host.machine_costs): an idle wakeup a saturated run never
showed, pathprof's own delay line behind an added link delay, and what a finished run teaches the machine file."""
import json
from pathlib import Path

import pytest
from pathprof.agent.host import delayline, machine_costs
from pathprof.analysis import predict as P
from pathprof.analysis.predict_inputs import learned_costs, machine_value
from pathprof.analysis.rundir import RunDir
from pathprof.analysis.summary import summarize

RUNS = Path(__file__).parent / "data" / "runs"


def cost(value):
    return {"value": value, "run": "runs/x", "at": "2026-11-25T05:00:00Z"}


def test_a_run_that_never_idled_takes_the_machines_idle_wakeup_delay():
    rd = RunDir.open(RUNS / "loopback")          # 2 clients, CPU-bound: no wakeup found an idle CPU
    alone = P.base_of(rd)
    assert not alone.idle_priced
    b = P.base_of(rd, machine={"idle_wakeup_us": cost(15.0)})
    assert b.idle_priced and b.idle_us == pytest.approx(15.0 * b.receivers)
    # still anchored (within 2 %: the run's own 0.03 foreign CPUs kept the CPUs from idling, the prediction not)
    assert P.predict(b, [b.clients])[0]["tps"] == pytest.approx(b.measured_tps, rel=0.02)
    one, one_alone = P.predict(b, [1])[0], P.predict(alone, [1])[0]
    assert one["tps"] < one_alone["tps"] and not one.get("idle_wakeups_unpriced")
    assert one_alone.get("idle_wakeups_unpriced")
    assert any("that delay is the machine's" in a for a in one["assumptions"])


def test_an_idle_machine_s_run_queue_joins_its_idle_exits_for_a_lone_client():
    # the loopback base wakes 2 processes a transaction: on an idle machine each leaves an idle CPU (2 CPUs) and
    # waits on a run queue too; with more processes than CPUs only as many idle exits as CPUs
    rd = RunDir.open(RUNS / "loopback")
    b = P.base_of(rd, machine={"idle_wakeup_us": cost(20.0), "lowload_runqueue_us": cost(8.0)})
    assert b.receivers == 2 and b.idle_us == pytest.approx(2 * 20.0 + 2 * 8.0)
    exits_only = P.base_of(rd, machine={"idle_wakeup_us": cost(20.0)})
    assert P.predict(b, [1])[0]["tps"] < P.predict(exits_only, [1])[0]["tps"]
    assert any("wait 8.0 µs each on a run queue" in a for a in P.predict(b, [1])[0]["assumptions"])
    hops = P.base_of(RunDir.open(RUNS / "docker-dnat"),
                     machine={"idle_wakeup_us": cost(20.0), "lowload_runqueue_us": cost(8.0)})
    assert hops.receivers == 4 and hops.idle_us == pytest.approx(2 * 20.0 + 4 * 8.0)


def test_a_lone_client_s_run_teaches_the_run_queue_of_an_idle_machine():
    # loopback, 1 client, 2026-11-28 (bench/predict all): 1.92 idle exits and 17.4 µs of run queue and wakeup
    # latency per transaction for its 2 processes woken
    rd = RunDir.open(RUNS.parent / "recent" / "loopback-1client")
    s = summarize(rd)
    waits = sum(x["us_per_txn"] for x in s["stages"] if not x.get("parent")
                and x["name"].startswith(("runqueue.", "wakeup.")))
    learned = learned_costs(rd, s)
    assert learned["lowload_runqueue_us"] == pytest.approx(waits / 2, abs=0.01) and learned["idle_wakeup_us"] > 0
    # a saturated run teaches neither (its waits are queues behind the other clients, not an idle machine's)
    assert "lowload_runqueue_us" not in learned_costs(RunDir.open(RUNS / "docker-dnat"),
                                                      summarize(RunDir.open(RUNS / "docker-dnat")))


def test_a_lone_client_beside_foreign_load_teaches_nothing_of_an_idle_machine():
    # the same run with other processes using 0.5 CPUs beside it (a test suite's other lane): its wakeups waited
    # behind them, not an idle machine's, and the delay line's cost is still its own
    rd = RunDir.open(RUNS.parent / "recent" / "loopback-1client")
    s = summarize(rd)
    tps = (s.get("windows") or {}).get("tps_in") or s["tps"]
    s["cpu"] = [c for c in s["cpu"] if c["component"] != "other"] + [
        {"component": "other", "us_per_txn": 0.5e6 / tps}]
    learned = learned_costs(rd, s)
    assert "idle_wakeup_us" not in learned and "lowload_runqueue_us" not in learned, learned


def test_a_saturated_runs_few_idle_exits_give_way_to_the_machines():
    # docker-dnat at 16 clients: a few of its wakeups found an idle CPU (enough to price one, too few to trust)
    rd = RunDir.open(RUNS / "docker-dnat")
    own = P.base_of(rd)
    b = P.base_of(rd, machine={"idle_wakeup_us": cost(14.0)})
    assert b.idle_us == pytest.approx(14.0 * b.receivers) and b.idle_us != pytest.approx(own.idle_us)


def test_a_recorded_machine_cost_wins_over_the_one_given():
    rd = RunDir.open(RUNS / "loopback")
    rd.meta["machine_costs"] = {"idle_wakeup_us": cost(10.0)}
    assert P.base_of(rd, machine={"idle_wakeup_us": cost(40.0)}).idle_us == pytest.approx(10.0 * 2)


def test_an_added_delay_is_priced_as_the_delay_line_pathprof_builds():
    machine = {"delayline_cpu_us_per_packet": cost(4.0), "delayline_packets_per_round_trip_each": cost(2.5)}
    pure, built = P.base_of(RunDir.open(RUNS / "docker-dnat")), P.base_of(RunDir.open(RUNS / "docker-dnat"),
                                                                          machine=machine)
    sc = P.Scenario(link_us={"pp-dk-veth0": 250.0})
    m = P.apply(built, sc)
    us = 4.0 * 2.5 * built.round_trips
    assert m.cpu["delayline"] == pytest.approx(us) and m.delaylines["pp-dk-veth0"] == (1, pytest.approx(us))
    row, row_pure = P.predict(built, [16], sc)[0], P.predict(pure, [16], sc)[0]
    assert row["tps"] < row_pure["tps"]                       # a CPU-bound path pays the daemon's CPU
    assert any("delay line(s)" in a and "µs CPU per packet" in a for a in row["assumptions"])
    assert any("unknown on this machine" in a for a in row_pure["assumptions"])
    # one client: the daemon works on a packet while it holds it, so its CPU is inside the delay
    one, one_pure = P.predict(built, [1], sc)[0], P.predict(pure, [1], sc)[0]
    assert one["tps"] == pytest.approx(one_pure["tps"], rel=0.02)


def test_a_delay_line_thread_saturates_like_a_hop():
    machine = {"delayline_cpu_us_per_packet": cost(200.0), "delayline_packets_per_round_trip_each": cost(2.0)}
    b = P.base_of(RunDir.open(RUNS / "docker-dnat"), machine=machine)
    row = P.predict(b, [64], P.Scenario(link_us={"pp-dk-veth0": 100.0}))[0]
    assert row["limited_by"] == "delayline.pp-dk-veth0"        # one daemon, 400 µs per transaction: 2,500 TPS
    assert row["tps"] <= 1e6 / 400.0 * 1.001


def test_a_run_that_idled_teaches_the_delay_of_one_wakeup_onto_an_idle_cpu():
    rd = RunDir.open(RUNS / "pgbouncer-traces")   # 2 clients, latency-bound, wakeups onto idle CPUs
    s = summarize(rd)
    learned = learned_costs(rd, s)
    idle = [x for x in s["stages"] if x["name"].startswith("idle_exit.")]
    per_wakeup = sum(x["us_per_txn"] for x in idle) / sum(x["count_per_txn"] for x in idle)
    assert learned["idle_wakeup_us"] == pytest.approx(per_wakeup, rel=0.01)
    saturated = RunDir.open(RUNS / "loopback")
    assert "idle_wakeup_us" not in learned_costs(saturated, summarize(saturated))


def test_a_run_with_delay_lines_teaches_their_cost_per_packet():
    rd = RunDir.open(RUNS / "docker-dnat")
    s = summarize(rd)
    rd.meta["delay_lines"] = [{"line": "pp-a/4200", "cpu_us": 30000.0, "packets": 6000},
                              {"line": "pp-b/4200", "cpu_us": 20000.0, "packets": 4000}]
    learned = learned_costs(rd, s)
    assert learned["delayline_cpu_us_per_packet"] == pytest.approx(5.0)
    # two delay lines (both directions): the packets per round trip of each
    assert learned["delayline_packets_per_round_trip_each"] == pytest.approx(
        10000 / s["transactions"] / P.base_of(rd, s).round_trips / 2, rel=0.01)
    # a run whose messages took many packets (a large result, retransmissions): its workload, not the machine
    rd.meta["delay_lines"] = [{"line": "pp-a/4200", "cpu_us": 3e6, "packets": int(s["transactions"] * 80)}]
    learned = learned_costs(rd, s)
    assert "delayline_packets_per_round_trip_each" not in learned and learned["delayline_cpu_us_per_packet"] > 0


def test_the_machine_file_keeps_each_cost_with_the_run_that_measured_it(tmp_path):
    f = tmp_path / "machine-costs.json"
    assert machine_costs.current(f) == {}
    machine_costs.remember({"idle_wakeup_us": 12.5}, "runs/a", f)
    machine_costs.remember({"delayline_cpu_us_per_packet": 3.0}, "runs/b", f)
    doc = json.loads(f.read_text())
    assert doc["idle_wakeup_us"]["value"] == 12.5 and doc["idle_wakeup_us"]["run"] == "runs/a"
    assert doc["delayline_cpu_us_per_packet"]["run"] == "runs/b"
    f.write_text("not json")
    assert machine_costs.current(f) == {}


def test_a_cost_is_the_median_of_the_last_runs_that_measured_it_whatever_their_order(tmp_path):
    """One path's run is one view of the machine (stop 51: 3.3 µs per idle wakeup on loopback, nic and pgbouncer,
    5.9 on docker-dnat): the last run to measure it no longer prices every other path alone."""
    values = [3.3, 3.2, 5.9, 3.4, 3.3, 6.1, 3.2]
    seen = []
    for order in (values, list(reversed(values))):
        f = tmp_path / f"costs-{len(seen)}.json"
        f.write_text(json.dumps({"idle_wakeup_us": {"value": 9.9, "run": "runs/old", "at": "then"}}))  # old form
        for i, v in enumerate(order):
            machine_costs.remember({"idle_wakeup_us": v}, f"runs/{i}", f)
        entry = json.loads(f.read_text())["idle_wakeup_us"]
        assert len(entry["samples"]) == machine_costs.RECENT_RUNS and entry["run"] == f"runs/{len(order) - 1}"
        seen.append(entry["value"])
        value, source = machine_value({"idle_wakeup_us": entry}, "idle_wakeup_us")
        assert value == entry["value"] and f"median of the last {machine_costs.RECENT_RUNS} runs" in source
    # each order's last five: 5.9, 3.4, 3.3, 6.1, 3.2 and 3.3, 3.4, 5.9, 3.2, 3.3; never a docker-dnat's 5.9 or 6.1
    assert seen == [3.4, 3.3], seen


def test_delay_line_usage_over_the_interval():
    before = {"pp-a/4200": {"cpu_us": 1000.0, "packets": 10}, "pp-b/4201": {"cpu_us": 5.0, "packets": 1}}
    after = {"pp-a/4200": {"cpu_us": 4000.0, "packets": 1010}}
    assert delayline.usage_during(before, after) == [{"line": "pp-a/4200", "cpu_us": 3000.0, "packets": 1000}]


def test_a_links_name_builds_one_delay_line_per_direction():
    machine = {"delayline_cpu_us_per_packet": cost(30.0), "delayline_packets_per_round_trip_each": cost(1.0)}
    b = P.base_of(RunDir.open(RUNS / "cross-zone"), machine=machine)
    b.delays["link delay lines and rate limits"] = 0.0      # as if the run had had no delay of its own
    m = P.apply(b, P.Scenario(link_us={"wire": 500.0}))
    assert m.delaylines["wire"] == (2, pytest.approx(30.0 * 1.0 * b.round_trips * 2))
    assert m.cpu["delayline"] == pytest.approx(60.0 * b.round_trips)
    with_lines = P.apply(P.base_of(RunDir.open(RUNS / "cross-zone"), machine=machine),
                         P.Scenario(link_us={"wire": 500.0}))
    assert "delayline" not in with_lines.cpu                  # the run had delay lines: their CPU is in it already


def test_a_run_its_hops_thread_limited_is_not_anchored_on_idle_wakeups():
    # pgbouncer-traces as if the pooler's thread had found its next message waiting 99 % of the time: the hop
    # limited the run (latency-bound by the CPUs' measure); the cycle's rest is its queue, not idle wakeups
    rd = RunDir.open(RUNS / "pgbouncer-traces")
    s = summarize(rd)
    for st in s["stages"]:
        if st["name"] in ("wakeup.pgbouncer", "idle_exit.pgbouncer"):
            st["count_per_txn"] = 0.005
        elif st["name"] == "queued.pgbouncer":
            st["count_per_txn"] = 0.99
    b = P.base_from_run(s)
    assert b.regime == "latency-bound" and b.hop_us.get("pgbouncer")
    # priced as a saturated run prices it: the mean idle exit its wakeups showed, for each process woken
    idle = [x for x in s["stages"] if x["name"].startswith("idle_exit.")]
    per_wakeup = sum(x["us_per_txn"] for x in idle) / sum(x["count_per_txn"] for x in idle)
    assert b.idle_us == pytest.approx(per_wakeup * b.receivers, rel=0.01)
    rows = P.predict(b, [1, b.clients])
    assert rows[0]["tps"] <= rows[1]["tps"] <= b.measured_tps * 1.01
