"""Probes on a real PostgreSQL + pgbench: stages present where the path has them, closure, ground truth."""
import os
import subprocess

import pytest
from probe_harness import ThrowawayPostgres, profile

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pg():
    if os.geteuid() != 0:
        pytest.skip("needs root")
    p = ThrowawayPostgres(55437).start()
    yield p
    p.stop()


@pytest.fixture(scope="module")
def profiled(pg):
    """profiled(**kw): profile(pg, **kw) made once per module and settings; the tests only read it (the loopback
    select 1 at 1 client is both a closure case and the base of the pg_sleep comparison)."""
    done = {}

    def get(**kw):
        key = tuple(sorted(kw.items()))
        if key not in done:
            done[key] = profile(pg, **kw)
        return done[key]
    return get


@pytest.mark.parametrize("lo_device", [False, True], ids=["lo-folded", "lo-timed"])
def test_loopback_tcp_closes_and_brackets_only_hooks_in_use(profiled, lo_device):
    r = profiled(clients=1, lo_device=lo_device)
    n = r["names"]
    for stage in ("wire.backend", "backend.execute", "wire.pgbench", "client.pgbench"):
        assert stage in n, (stage, sorted(n))
    # lo is its own stage only when asked for; folded, its time stays in the wire and the view still closes
    assert ("dev.lo" in n) == lo_device, sorted(n)
    # netfilter brackets sit only on hooks that have functions registered (rules, conntrack); loopback
    # traffic crosses output, postrouting, prerouting and input, so exactly those of them appear
    hooks = r["result"].cost["netfilter_hooks"]["root"]
    crossed = {f"netfilter.{h}" for h in hooks if h != "forward"}
    assert crossed == {s for s in n if s.startswith("netfilter.")}, (hooks, sorted(n))
    legs = {s["leg"] for s in r["latency"]["stages"]}
    assert {"request", "server", "response", "client"} <= legs
    assert abs(r["latency"]["closure_error_pct"]) <= 10, r["latency"]
    # At 1 client the CPUs are partly idle and the CPU view misses ~10 % of busy time (interrupt time the
    # probes do not see, measured -11 % on unix/loopback/nic alike); the CPU view is the one that matters when
    # the CPUs are saturated, checked at 16 clients below.
    assert abs(r["cpu"]["closure_error_pct"]) <= 15, r["cpu"]
    comps = {c["component"] for c in r["cpu"]["components"]}
    assert {"backend.sys", "pgbench.sys", "softirq.net"} <= comps
    assert r["result"].cost["run_time_ns"] > 0 and r["cost_ns_per_txn"] > 0
    assert r["result"].counters["messages"] >= 2 * r["txns"] * 0.95


def test_cpu_view_closes_when_cpus_are_saturated(pg):
    r = profile(pg, clients=16)
    assert r["cpu"]["regime"] == "cpu-bound", r["cpu"]
    assert abs(r["cpu"]["closure_error_pct"]) <= 10, r["cpu"]


def test_unix_socket_has_no_netfilter(pg):
    r = profile(pg, unix=True, clients=1)
    n = r["names"]
    assert "backend.execute" in n and "client.pgbench" in n
    assert not [s for s in n if s.startswith(("netfilter.", "dev."))], sorted(n)
    assert r["result"].counters["wire_untimed"] > 0          # unix: no TCP send-start tracepoint
    assert abs(r["latency"]["closure_error_pct"]) <= 10, r["latency"]


def test_pg_sleep_moves_backend_execute_by_2ms(pg, profiled):
    base = profiled(clients=1, lo_device=False)
    slow = profile(pg, script="sleep.sql", clients=1)
    delta = slow["names"]["backend.execute"] - base["names"]["backend.execute"]
    assert 1500 <= delta <= 2600, delta
    for st in ("wire.backend", "wire.pgbench"):     # the network stages stay where they were
        assert abs(slow["names"][st] - base["names"][st]) < 50, (st, base["names"][st], slow["names"][st])


@pytest.fixture(scope="module")
def deep(pg):
    """One deep profile read by the two tests below: pg_sleep(2 ms) per transaction on the tracked server, while a
    second, untracked server runs select 1 as fast as it can."""
    other = ThrowawayPostgres(55438).start()
    load = None
    try:
        load = subprocess.Popen(["runuser", "-u", "postgres", "--", "pgbench", "-n", "-M", "prepared", "-f",
                                 str(other.dir / "select1.sql"), "-c", "1", "-T", "5", "-h", "127.0.0.1",
                                 "-p", str(other.port), "postgres"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        return profile(pg, level="deep", script="sleep.sql", clients=1)
    finally:
        if load is not None:
            load.kill()
            load.wait()
        other.stop()


def test_deep_adds_usdt_breakdown(deep):
    kids = {s["name"]: s for s in deep["latency"]["stages"] if s.get("parent") == "backend.execute"}
    assert "backend.query" in kids or "backend.executor" in kids, sorted(deep["names"])
    q = kids.get("backend.query") or kids["backend.executor"]
    # 2 ms of pg_sleep and the query around it; the sleep's own wake-up comes later on a loaded machine (the other
    # lane beside it: 2,741 µs in fresh-clone CI r6, 2026-11-27), so the upper bound is what no stage mix-up reaches
    assert 1500 <= q["us_per_txn"] <= 4000, q


def test_untracked_postgres_never_enters_the_figures(deep):
    """USDT probes are attached to the binary (every postgres mapping it takes the traps), but only tracked
    threads are counted: a second, untracked server under load (tens of its executor spans for each of the run's
    own) leaves the per-transaction counts of the run's own stages where they are (one executor span and one
    request per transaction, not more)."""
    per_txn = {s["name"]: s["count_per_txn"] for s in deep["latency"]["stages"]}
    assert 0.9 <= per_txn["backend.executor"] <= 1.1, per_txn
    assert 0.9 <= per_txn["backend.execute"] <= 1.1, per_txn
