"""The latency and CPU views on hand-made probe tables (no kernel needed)."""
import pandas as pd
import pytest
from pathprof.analysis import stages as views
from pathprof.analysis.histogram import HIST_SLOTS, quantile, slot_bounds


def hist_at(ns: float, n: int) -> list[int]:
    """A histogram with n samples in the slot holding `ns`."""
    h = [0] * HIST_SLOTS
    for i in range(HIST_SLOTS):
        lo, hi = slot_bounds(i)
        if lo <= ns < hi:
            h[i] = n
            return h
    raise AssertionError(ns)


def row(kind, role="", leg="", sum_us=0.0, count=1000, hop="", hook="", netns="", dev="", at_us=None):
    return {"kind": kind, "role": role, "hop": hop, "leg": leg, "hook": hook, "netns": netns, "dev": dev,
            "count": count, "sum_ns": int(sum_us * 1000 * count),
            "hist": hist_at((at_us if at_us is not None else sum_us) * 1000, count)}


def stages_1client(execute_us=5.0):
    # per message: wire 7 (of which netfilter 4x0.2 + lo 1), waits, processing; 1000 transactions
    rows = [row("wire", "backend", "request", 7.0), row("wire", "pgbench", "response", 7.0),
            row("dev", "kernel", "request", 1.0, dev="lo"), row("dev", "kernel", "response", 1.0, dev="lo"),
            row("wakeup", "backend", "request", 1.0), row("runqueue", "backend", "request", 4.0),
            row("recv", "backend", "request", 2.0), row("proc", "backend", "server", execute_us),
            row("wakeup", "pgbench", "response", 1.0), row("runqueue", "pgbench", "response", 3.0),
            row("recv", "pgbench", "response", 2.0), row("proc", "pgbench", "client", 2.0),
            row("sched_runq", "backend", "", 4.0, count=1200) | {"hist": None}]
    for leg in ("request", "response"):
        for hook in ("output", "postrouting", "prerouting", "input"):
            rows.append(row("netfilter", "kernel", leg, 0.2, hook=hook, netns="root"))
            rows.append(row("nf_all", "kernel", leg, 0.2, count=2000, hook=hook, netns="root"))
    return pd.DataFrame(rows)


def by_name(view):
    return {(s["name"], s["leg"]): s for s in view["stages"]}


def test_stage_names_and_legs():
    v = views.latency_view(stages_1client(), 1000, 40.0)
    names = by_name(v)
    for key in [("wire.backend", "request"), ("netfilter.output", "request"), ("netfilter.input", "response"),
                ("dev.lo", "request"), ("runqueue.backend", "request"), ("backend.execute", "server"),
                ("recv.pgbench", "response"),
                ("client.pgbench", "client")]:
        assert key in names, key
    assert v["netfilter_packets_per_txn"] == 16.0
    assert v["scheduler"][0]["role"] == "backend"
    legs = [s["leg"] for s in v["stages"]]
    assert legs == sorted(legs, key=lambda l: views.LEG_ORDER[l])


def test_wire_is_exclusive_and_view_closes():
    v = views.latency_view(stages_1client(), 1000, 40.0)
    names = by_name(v)
    assert names[("wire.backend", "request")]["us_per_txn"] == pytest.approx(7.0 - 0.8 - 1.0, abs=1e-3)
    # 7+7 wire + 1+4+2 + 5 + 1+3+2 + 2 = 34 µs per transaction
    assert v["total_us"] == pytest.approx(34.0, abs=1e-2)
    assert v["closure_error_pct"] == pytest.approx((34.0 - 40.0) / 40.0 * 100, abs=0.05)


def test_percentiles_from_histogram():
    v = views.latency_view(stages_1client(), 1000, 34.0)
    ex = by_name(v)[("backend.execute", "server")]
    assert 4.0 <= ex["p50_us"] <= 6.5 and 4.0 <= ex["p99_us"] <= 6.5
    assert quantile([0] * 128, 0.5) is None


def test_ground_truth_shift_moves_only_execute():
    a = by_name(views.latency_view(stages_1client(5.0), 1000, 34.0))
    b = by_name(views.latency_view(stages_1client(2005.0), 1000, 2034.0))
    assert b[("backend.execute", "server")]["us_per_txn"] - a[("backend.execute", "server")]["us_per_txn"] == \
        pytest.approx(2000.0, abs=0.01)
    assert b[("wire.backend", "request")]["us_per_txn"] == a[("wire.backend", "request")]["us_per_txn"]


def test_hop_and_usdt_names():
    df = pd.DataFrame([row("proc", "proxy", "request", 3.0, hop="docker-proxy"),
                       row("runqueue", "proxy", "response", 2.0, hop="docker-proxy"),
                       row("pg_execute", "backend", "server", 1.0), row("proc", "backend", "server", 4.0)])
    v = views.latency_view(df, 1000, 10.0)
    names = by_name(v)
    assert ("hop.docker-proxy", "request") in names
    assert ("runqueue.docker-proxy", "response") in names
    assert names[("backend.executor", "server")]["parent"] == "backend.execute"
    assert v["total_us"] == pytest.approx(9.0, abs=1e-3)     # the USDT child is not summed again


def test_empty_tables():
    assert views.latency_view(pd.DataFrame(), 0, 10.0)["stages"] == []
    cv = views.cpu_view(pd.DataFrame(), 0, 10, 10, 2)
    assert cv["components"] == [] and cv["regime"] == "latency-bound"


def cpu_table(other_ns=0):
    rows = [("user", "pgbench", "", "", 2_000_000), ("sys", "pgbench", "", "", 8_000_000),
            ("user", "backend", "", "", 5_000_000), ("sys", "backend", "", "", 10_000_000),
            ("user", "proxy", "docker-proxy", "", 3_000_000),
            ("softirq", "", "", "task", 6_000_000), ("softirq", "", "", "idle", 1_000_000),
            ("netfilter", "", "", "", 1_000_000), ("other", "", "", "", other_ns)]
    return pd.DataFrame([{"comp": c, "role": r, "hop": h, "where": w, "ns": ns, "count": 0} for c, r, h, w, ns in rows])


def test_cpu_view_components_closure_and_regime():
    # 1000 txns, 36 ms of CPU; busy 40 ms over 20 ms elapsed on 2 CPUs -> saturated
    cv = views.cpu_view(cpu_table(other_ns=4_000_000), 1000, 40_000_000, 20_000_000, 2)
    comps = {c["component"]: c["us_per_txn"] for c in cv["components"]}
    assert comps["backend.sys"] == 10.0 and comps["hop.docker-proxy.user"] == 3.0
    assert comps["softirq.net"] == 7.0 and comps["netfilter"] == 1.0 and comps["other"] == 4.0
    assert cv["components"][-1]["component"] == "other"
    assert cv["closure_error_pct"] == pytest.approx(0.0)
    assert cv["regime"] == "cpu-bound" and cv["busy_cpus"] == 2.0
    # run CPUs = 2 - 0.2 = 1.8 over 36 µs per txn -> 50 000 TPS
    assert cv["predicted_tps"] == pytest.approx(50_000, rel=1e-3)


def test_cpu_view_latency_bound_uses_littles_law():
    cv = views.cpu_view(cpu_table(), 1000, 10_000_000, 20_000_000, 2, clients=1, latency_us=50.0)
    assert cv["regime"] == "latency-bound" and cv["predicted_tps"] == pytest.approx(20_000)
    assert cv["closure_error_pct"] == pytest.approx((36 - 10) / 10 * 100)


def test_probe_cost():
    assert views.probe_cost_ns_per_txn({"run_time_ns": 5000}, 10) == 500.0
    assert views.probe_cost_ns_per_txn(None, 10) is None


def test_closure_against_cycle_time_when_given():
    v = views.latency_view(stages_1client(), 1000, 30.0, cycle_us=34.0)
    assert v["closure_basis"] == "cycle" and v["closure_error_pct"] == pytest.approx(0.0, abs=0.05)
    assert views.latency_view(stages_1client(), 1000, 34.0)["closure_basis"] == "latency"


def test_disk_view_per_device_and_operation():
    stages = pd.DataFrame([
        {"kind": "block", "role": "kernel", "hop": "", "leg": "", "hook": "flush", "netns": "", "dev": "vda",
         "count": 1000, "sum_ns": 1000 * 50_000, "hist": None},
        {"kind": "block", "role": "kernel", "hop": "", "leg": "", "hook": "write", "netns": "", "dev": "vda",
         "count": 2000, "sum_ns": 2000 * 60_000, "hist": None},
        {"kind": "wire", "role": "backend", "hop": "", "leg": "request", "hook": "", "netns": "", "dev": "",
         "count": 1000, "sum_ns": 1000 * 5_000, "hist": None}])
    d = views.disk_view(stages, 1000)
    assert [(x["device"], x["op"], x["requests_per_txn"], x["us_per_txn"], x["mean_us"]) for x in d] == [
        ("vda", "write", 2.0, 120.0, 60.0), ("vda", "flush", 1.0, 50.0, 50.0)]
    # the disk is not a stage of the transaction's timeline: the latency view leaves it out
    assert [s["name"] for s in views.latency_view(stages, 1000, 5.0)["stages"]] == ["wire.backend"]


def test_execute_splits_into_exclusive_parts_that_add_up():
    """A commit whose XLogFlush (300 µs) waited 100 µs of it on an LWLock, plus an 80 µs row-lock wait, inside a
    600 µs backend.execute. Inclusive, wal_flush + lwlock_wait + lock_wait would be 480; the exclusive parts the
    probes recorded (pg_excl, owner in `hook`) are 300 + 0 + 80, and backend.execute.other is the 220 left. The
    executor phase overlaps them: shown, never summed; the view's total counts backend.execute once."""
    df = stages_1client(execute_us=600.0)
    df = pd.concat([df, pd.DataFrame([
        row("pg_wal_flush", "backend", "server", 300.0), row("pg_lwlock", "backend", "server", 100.0),
        row("pg_lock", "backend", "server", 80.0), row("pg_execute", "backend", "server", 500.0),
        row("pg_lwlock", "pg_aux", "server", 50.0),                       # the WAL writer's: not a transaction's
        row("pg_excl", "backend", "server", 300.0, hook="pg_wal_flush"),
        row("pg_excl", "backend", "server", 80.0, hook="pg_lock"),
        row("pg_excl", "pg_aux", "server", 50.0, hook="pg_lwlock")])], ignore_index=True)
    v = views.latency_view(df, 1000, 1.0)
    s = by_name(v)
    parts = {n: st for (n, leg), st in s.items() if st.get("part")}
    assert set(parts) == {"backend.wal_flush", "backend.lwlock_wait", "backend.lock_wait", "backend.execute.other"}
    assert parts["backend.wal_flush"]["us_per_txn"] == pytest.approx(300.0)
    assert parts["backend.lwlock_wait"]["us_per_txn"] == 0.0
    assert parts["backend.lwlock_wait"]["inclusive_us"] == pytest.approx(100.0)
    assert parts["backend.execute.other"]["us_per_txn"] == pytest.approx(220.0)
    assert sum(p["us_per_txn"] for p in parts.values()) == pytest.approx(s[("backend.execute", "server")]["us_per_txn"])
    assert s[("backend.executor", "server")].get("phase") and not s[("backend.executor", "server")].get("part")
    assert v["execute_split"] == {"execute_us": 600.0, "parts_us": 380.0, "other_raw_us": 220.0,
                                  "parts_pct": pytest.approx(63.33, abs=0.01)}
    no_deep = views.latency_view(stages_1client(execute_us=600.0), 1000, 1.0)
    assert v["total_us"] == pytest.approx(no_deep["total_us"])       # nothing nested is counted twice


def test_runs_without_exclusive_times_keep_the_inclusive_parts():
    """Runs recorded before the exclusive split: the I/O stages stay inclusive, under execute, with no `other`."""
    df = pd.concat([stages_1client(execute_us=600.0),
                    pd.DataFrame([row("pg_wal_flush", "backend", "server", 300.0)])], ignore_index=True)
    v = views.latency_view(df, 1000, 1.0)
    s = by_name(v)
    assert s[("backend.wal_flush", "server")]["us_per_txn"] == pytest.approx(300.0)
    assert "part" not in s[("backend.wal_flush", "server")] and ("backend.execute.other", "server") not in s
    assert "execute_split" not in v


def test_connwait_is_a_response_stage_of_pgbench_in_the_total():
    """--connect: the part of a reply's wait while its pgbench thread opened another connection (carved out of
    wakeup/recv/runqueue in the kernel, so it adds to them rather than overlapping)."""
    df = pd.concat([stages_1client(), pd.DataFrame([row("connwait", "pgbench", "response", 30.0)])], ignore_index=True)
    base = views.latency_view(stages_1client(), 1000, 100.0)
    lv = views.latency_view(df, 1000, 100.0)
    names = {(s["name"], s["leg"]): s["us_per_txn"] for s in lv["stages"]}
    assert names[("connwait.pgbench", "response")] == pytest.approx(30.0)
    assert lv["total_us"] == pytest.approx(base["total_us"] + 30.0)


def test_send_blocked_is_a_response_stage_of_the_sender_and_holds_the_devices_the_wires_cannot():
    """A large result to a client with a full receive window (#22.2): send_blocked.backend on the response leg, in
    the total. Its segments crossed the devices during the wait too: device time beyond the leg's wires comes out of
    it, so the leg's sum is the time the leg took (wire 7 + blocked 100 = 107 µs for dev 1 + 9 µs)."""
    extra = pd.DataFrame([row("send_blocked", "backend", "response", 100.0),
                          row("dev", "kernel", "response", 8.0, dev="veth")])
    lv = views.latency_view(pd.concat([stages_1client(), extra], ignore_index=True), 1000, 200.0)
    names = {(s["name"], s["leg"]): s["us_per_txn"] for s in lv["stages"]}
    assert names[("wire.pgbench", "response")] == pytest.approx(0.0)
    assert names[("send_blocked.backend", "response")] == pytest.approx(100.0 - (0.8 + 1.0 + 8.0 - 7.0))
    leg = sum(us for (n, lg), us in names.items() if lg == "response" and not n.startswith(
        ("wakeup.", "runqueue.", "recv.")))
    assert leg == pytest.approx(107.0)
    from pathprof.analysis.causes import cause_of
    assert cause_of("send_blocked.backend", set()) == "slow reader"
    assert cause_of("send_blocked.pgbouncer", {"pgbouncer"}) == "slow reader"
