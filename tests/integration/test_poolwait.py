"""A pooler with fewer server connections than clients (#22): the time a client's request waits inside the pooler
is a stage of its own (poolwait.<hop>), the views still close, the wait carries the gap between two pool sizes,
pgbouncer's own counters agree with it (Little's law), and sampled transactions follow the request through the
pooler to whichever server connection served it. Ground truth: pgbouncer in transaction mode, pool of 1 and 2
against a pool as large as the clients, everything else equal."""
import json

import pandas as pd
import pytest
from conftest import run_pathprof
from pathprof.analysis.report.waterfall import transactions
from truth import record

pytestmark = pytest.mark.integration
CLIENTS = 16


def _entry(pool: int, mode: str = "transaction") -> str:
    return f"pgbouncer:option=pool_mode={mode}:option=pool_size={pool}"


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    runs_dir = tmp_path_factory.mktemp("runs")
    cp = run_pathprof("compare", _entry(CLIENTS), _entry(1), _entry(2), _entry(2, "statement"),
                      "--clients", str(CLIENTS), "--mode", "extended", "--duration", "3", "--probe-duty", "100",
                      "--trace-sample", "10", "--json", runs_dir=runs_dir, check=True, timeout=600)
    doc = json.loads(cp.stdout)
    return doc, doc["runs"][:3]


def _stage(summary: dict, name: str) -> float:
    return sum(s["us_per_txn"] for s in summary["stages"] if s["name"] == name and not s.get("parent"))


def test_every_pool_size_closes_and_the_wait_is_named(compared):
    _, (full, one, two) = compared
    # every pool size within ±5 %: a pool of one too. Its lock-step "slow mode" (each forward finds one held
    # request: the requests read before the window opened were never queued) left poolwait short by ~2 round trips
    # (-12 ... -15 %, -79 % at 1 ms per round trip) while the wait was charged at the queue's pop; it is now
    # charged when the hop answers that client (holdq.bpf.h)
    for r in (full, one, two):
        assert abs(r["closure"]["latency_error_pct"]) <= 5, (r["closure"], r["topology_options"])
    cycle = lambda r: r["closure"]["cycle_us"]   # noqa: E731
    # a pool as large as the clients: no request waits for a server connection
    assert _stage(full, "poolwait.pgbouncer") < 0.05 * cycle(full), full["stages"]
    # a pool of one: most of the cycle is the wait for the one server connection
    assert _stage(one, "poolwait.pgbouncer") > 0.5 * cycle(one), one["stages"]


def test_the_pooler_wait_carries_the_gap(compared):
    doc, (full, one, _) = compared
    expl = next(e for e in doc["explanations"] if e["run"] == _entry(1))
    items = {i["name"]: i for i in expl["items"]}
    gap = sum(i["delta_us_per_txn"] for i in expl["items"]) or 1.0
    # Not asserted: that the pool of one is slower. 16 clients on 2 CPUs are CPU-bound, and one server
    # connection doing all the work is not the bottleneck there (18,809 TPS against 18,171 with a full pool in
    # fresh-clone CI, 2026-11-27): the wait replaces run-queue waiting instead of adding to it. What the pool's
    # size does guarantee is the wait itself, and that it is the largest move, whichever way the gap goes.
    wait = items["poolwait.pgbouncer"]["delta_us_per_txn"]
    record("poolwait move / pool-of-1 cycle", wait / one["closure"]["cycle_us"], "> 0.3")
    record("poolwait move / gap", wait / gap, ">= 0.7 (gap > 0)")
    assert wait > 0.3 * one["closure"]["cycle_us"] and wait >= 0.7 * max(gap, 0.0), (one["tps"], full["tps"], expl)
    # the largest move that added time is the pooler's. Not the largest in size: on a loaded machine the queue in
    # the pooler replaced more run-queue waiting than it added (scheduler -413 µs against the pooler's wait, with
    # the helpers' builds beside a CI run, 2026-11-27)
    top = max(expl["causes"], key=lambda c: c["delta_us_per_txn"])
    assert top["name"] == "hop pgbouncer", expl["causes"]
    # ranked unless the pool's queue replaced more waiting elsewhere than the gap (a loaded machine's small gaps)
    assert expl["ranked"] or expl["verdict"] in ("smaller than its parts", "within noise"), expl
    if expl["ranked"]:
        assert expl["causes"][0]["name"] == "hop pgbouncer" and abs(expl["unexplained_pct"]) <= 30, expl


def test_pgbouncer_counts_the_waiting_clients_the_probes_time(compared):
    """Little's law: mean cl_waiting (SHOW POOLS) = TPS x poolwait per transaction, two independent sources."""
    _, (_, one, _) = compared
    (row,) = one["pooler_counters"]
    assert row["samples"] >= 4 and "error" not in row, row
    record("cl_waiting / expected", row["cl_waiting_mean"] / max(row["expected_waiting"], 1e-9), "Little's law")
    assert abs(row["cl_waiting_mean"] - row["expected_waiting"]) <= max(1.5, 0.35 * row["expected_waiting"]), row
    assert row["cl_waiting_max"] <= CLIENTS


def test_sampled_transactions_follow_the_request_to_whichever_server_connection(compared):
    _, (_, _, two) = compared
    traces = pd.read_parquet(f"{two['run_dir']}/traces.parquet")
    txns = transactions(traces)
    assert len(txns) >= 100, len(txns)
    waited = [t for t in txns if any(s["stage"] == "poolwait.pgbouncer" for s in t["spans"])]
    assert len(waited) >= 0.5 * len(txns)
    # one chain each: pgbench's request, the wait in the pooler, the pooler's forward, a backend, back to pgbench.
    # The waterfall chains spans by timestamps that meet (analysis.report.waterfall): where pgbouncer goes on to
    # forward the next held request at the instant its reply to another client was delivered, under the number of
    # the message it last read, two transactions can join into one chain. 0-2 per ~10,000 here, at the run's start
    # when 16 clients queue for a pool of 2 (14 local runs, 2026-11-26; one in the first 50 once in CI): a chain of
    # two is allowed that rarely, never a wrong order inside one.
    joined = 0
    for t in waited:
        stages = [s["stage"] for s in t["spans"]]
        if stages.count("backend.execute") == 1 and stages.count("client.pgbench") == 1:
            assert stages.index("poolwait.pgbouncer") < stages.index("backend.execute"), stages
        else:
            joined += 1
    assert joined <= max(3, len(waited) // 1000), (joined, len(waited))
    # a pool of two: transactions were served by both server connections, and the waterfall says which
    served = {t["backend_pid"] for t in txns}
    assert len(served - {None}) == 2, served
    # and the report says it: per backend, through which pooler process, transaction by transaction
    doc = two["served_by"]
    assert {b["pid"] for b in doc["backends"]} == served - {None}, doc["backends"]
    assert all(len(b["via"]["pgbouncer"]) == 1 for b in doc["backends"]), doc["backends"]
    assert doc["listed"] and all(x["txn"] and x["backend_pid"] in served for x in doc["listed"]), doc["listed"]


def test_statement_pooling_waits_the_same_way(compared):
    """pgbouncer in statement mode (a server connection per statement; select 1 is one): the same named wait, the
    same check against pgbouncer's own counters, the same answer to which server connection served each
    transaction. The check is pgbouncer's own timer of the wait (SHOW STATS): its SHOW POOLS count of waiting
    clients in statement mode is 0.6-0.8 of what its timer and the probes both say (CI, 2026-11-25)."""
    doc, _ = compared
    stmt = doc["runs"][3]
    assert stmt["topology_options"]["pool_mode"] == "statement", stmt["topology_options"]
    assert abs(stmt["closure"]["latency_error_pct"]) <= 5, stmt["closure"]
    assert _stage(stmt, "poolwait.pgbouncer") > 0.3 * stmt["closure"]["cycle_us"], stmt["stages"]
    (row,) = stmt["pooler_counters"]
    assert row["timed_txns"] > 1000 and row["agrees"] and not row["no_wait"] and row["servers"] == 2, row
    assert len(stmt["served_by"]["backends"]) == 2, stmt["served_by"]
