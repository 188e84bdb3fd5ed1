"""The connection-setup view on synthetic connect.parquet frames where the right answer is known."""
import ctypes as C
import json
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from pathprof.analysis import conn_view as V
from pathprof.analysis.rundir import RunDir

SLOTS = 128


def hist_at(ns: int, n: int) -> list[int]:
    """n samples of about `ns` (log-linear slot of common.h's hist_slot)."""
    lg = ns.bit_length() - 1
    slot = min(4 * (lg - 1) + ((ns >> (lg - 2)) & 3), SLOTS - 1)
    h = [0] * SLOTS
    h[slot] = n
    return h


def frame(steps: dict, stats: dict | None = None) -> pd.DataFrame:
    rows = []
    for name, (count, us) in steps.items():
        per = "total" if name == "cpu.postmaster" else "conn"
        kind = "cpu" if name.startswith("cpu.") else "latency"
        rows.append({"step": name, "kind": kind, "per": per, "count": count, "sum_ns": int(count * us * 1000),
                     "hist": None if per == "total" else hist_at(int(us * 1000), count)})
    for name, v in (stats or {}).items():
        rows.append({"step": name, "kind": "stat", "per": "", "count": v, "sum_ns": 0, "hist": None})
    return pd.DataFrame(rows)


UNIX = {"connect.accept": (100, 180.0), "connect.fork": (100, 480.0), "connect.first_run": (100, 150.0),
        "connect.backend_init_auth": (100, 2000.0), "connect.ready_delivery": (100, 80.0),
        "connect.first_query": (100, 250.0), "connect.teardown": (100, 2300.0), "connect.reap": (100, 100.0),
        "connect.total": (100, 2890.0), "cpu.backend_init": (100, 1900.0), "cpu.postmaster": (300, 200.0)}


def test_setup_steps_in_timeline_order_and_no_handshake_on_unix():
    rows = V.connection_setup_view(frame(UNIX), 100)
    assert [r["name"] for r in rows] == ["connect.accept", "connect.fork", "connect.first_run",
                                         "connect.backend_init_auth", "connect.ready_delivery"]
    assert rows[1]["us_per_conn"] == pytest.approx(480.0)
    # p50 from the histogram: inside the slot holding 480 µs (slots are 1/4 octave wide)
    assert 400 <= rows[1]["p50_us"] <= 560 and rows[1]["p99_us"] >= rows[1]["p50_us"]


def test_total_and_async_steps_are_not_in_the_setup_sum():
    names = {r["name"] for r in V.connection_setup_view(frame(UNIX), 100)}
    assert not names & {"connect.total", "connect.teardown", "connect.reap", "connect.first_query"}
    assert [r["name"] for r in V.connection_async_view(frame(UNIX), 100)] == V.ASYNC_STEPS


def test_tcp_handshake_comes_first_when_present():
    steps = dict(UNIX, **{"connect.tcp_handshake": (100, 40.0)})
    assert V.connection_setup_view(frame(steps), 100)[0]["name"] == "connect.tcp_handshake"


def test_aggregate_cpu_is_divided_by_connections_not_by_stints():
    cpu = {r["name"]: r for r in V.connection_cpu_view(frame(UNIX), 100)}
    # 300 on-CPU stints of 200 µs over 100 connections = 600 µs per connection
    assert cpu["cpu.postmaster"]["us_per_conn"] == pytest.approx(600.0)
    assert cpu["cpu.postmaster"]["p50_us"] is None
    assert cpu["cpu.backend_init"]["us_per_conn"] == pytest.approx(1900.0)


def test_per_connection_steps_average_over_connections_seen():
    # 80 of 100 connections matched: the mean is over the 80, not diluted by the 20 that were not seen
    rows = V.connection_setup_view(frame({"connect.fork": (80, 500.0)}), 100)
    assert rows[0]["us_per_conn"] == pytest.approx(500.0) and rows[0]["count"] == 80


def test_empty_or_missing_frame():
    assert V.connection_setup_view(None, 10) == []
    assert V.connection_setup_view(pd.DataFrame(columns=["step", "kind", "per", "count", "sum_ns", "hist"]), 10) == []


def make_rundir(tmp_path, fr, conn_ms=3.0, txns=100) -> RunDir:
    rd = RunDir.create(tmp_path, "unix")
    rd.update(pgbench={"result": {"transactions": txns, "failed": 0, "connection_time_ms": conn_ms}},
              probes={"level": "basic", "conn_cost": {"run_time_ns": 2_000_000, "run_cnt": 10}})
    if fr is not None:
        rd.write_frame("connect.parquet", fr)
    return RunDir.open(rd.path)


def test_add_connection_setup_fills_summary_and_closure(tmp_path):
    rd = make_rundir(tmp_path, frame(UNIX, {"matched": 100, "unmatched": 2, "no_peer": 1, "starts": 102}), conn_ms=3.0)
    s = {"closure": {"latency_error_pct": 1.0}}
    V.add_connection_setup(s, rd)
    total = 180 + 480 + 150 + 2000 + 80
    assert s["closure"]["connection_setup_us"] == pytest.approx(total)
    assert s["closure"]["connection_error_pct"] == pytest.approx((total - 3000) / 3000 * 100, abs=0.1)
    assert s["closure"]["latency_error_pct"] == 1.0          # untouched
    assert s["connection_probe"]["coverage_pct"] == 100.0
    assert s["connection_probe"]["lost"] == {"no_peer": 1}      # unmatched: other clients, not lost
    assert s["connection_probe"]["cost_ns_per_conn"] == pytest.approx(20_000)
    json.dumps(s)                                             # the --json document stays serialisable


def test_add_connection_setup_feeds_explain_and_render(tmp_path):
    from pathprof.analysis.explain import connection_totals
    from pathprof.analysis.report.render import connection_table
    rd = make_rundir(tmp_path, frame(UNIX))
    s = {}
    V.add_connection_setup(s, rd)
    assert connection_totals(s)["connect.backend_init_auth"] == pytest.approx(2000.0)
    from pathprof.analysis.report.render import render_to_string
    text = render_to_string(connection_table(s))
    row = next(line for line in text.splitlines() if "connect.backend_init_auth" in line)
    assert "2000" in row.replace(",", "") and "total" in text, text


def test_add_connection_setup_without_probe_data_is_a_no_op(tmp_path):
    s = {}
    V.add_connection_setup(s, make_rundir(tmp_path, None))
    assert "connection_setup" not in s


def test_task_mirror_matches_btf():
    """probes_conn._Task is written whole into the `who` map: it must match struct pc_task."""
    from pathprof.agent.probing.conn import _Task
    obj = Path(__file__).resolve().parents[2] / "probes" / "conn.bpf.o"
    if not shutil.which("bpftool") or not obj.exists():
        pytest.skip("bpftool or probes/conn.bpf.o missing")
    doc = json.loads(subprocess.run(["bpftool", "btf", "dump", "file", str(obj), "-j"], check=True,
                                    capture_output=True, text=True).stdout)
    t = next(t for t in doc["types"] if t.get("kind") == "STRUCT" and t.get("name") == "pc_task")
    assert C.sizeof(_Task) == t["size"]
    assert {m["name"]: m["bits_offset"] // 8 for m in t["members"]} == \
        {f[0]: getattr(_Task, f[0]).offset for f in _Task._fields_}


def test_thread_wait_is_an_aggregate_divided_by_the_connections_sampled(tmp_path):
    """connect.thread_wait is summed over the window (clients waiting x time), not one sample per connection: it is
    divided by the connections the probe sampled in the windows, not by its own count of accruals."""
    fr = frame(UNIX, {"sampled": 50, "matched": 100})
    wait = pd.DataFrame([{"step": "connect.thread_wait", "kind": "latency", "per": "total", "count": 400,
                          "sum_ns": 50 * 1_500_000, "hist": None}])
    s = {}
    V.add_connection_setup(s, make_rundir(tmp_path, pd.concat([fr, wait], ignore_index=True)))
    rows = {r["name"]: r for r in s["connection_setup"]}
    assert rows["connect.thread_wait"]["us_per_conn"] == pytest.approx(1500.0)
    assert [r["name"] for r in s["connection_setup"]][-1] == "connect.thread_wait"
    # pgbench's connection time (its connects and closes) does not contain the wait for its thread
    assert s["closure"]["connection_setup_us"] == pytest.approx(180 + 480 + 150 + 2000 + 80)


def test_thread_wait_through_a_pooler_is_divided_by_the_client_connects_sampled(tmp_path):
    """A pooler keeps its server connections: no backend starts, so none is sampled. The thread's wait is then
    per client connect sampled in the windows (connect.client_total's samples), not per connection of the whole run
    (pgbench's transactions): 2 s windows of a 5 s run made it 15 us for 41 and the closure -9 %."""
    fr = frame({"connect.client_total": (40, 170.0)}, {"starts": 100, "sampled": 0, "unpaired_sampled": 0})
    wait = pd.DataFrame([{"step": "connect.thread_wait", "kind": "latency", "per": "total", "count": 40,
                          "sum_ns": 40 * 41_000, "hist": None}])
    s = {}
    V.add_connection_setup(s, make_rundir(tmp_path, pd.concat([fr, wait], ignore_index=True), txns=100))
    rows = {r["name"]: r for r in s["connection_setup"]}
    assert rows["connect.thread_wait"]["us_per_conn"] == pytest.approx(41.0)   # was 16.4: over 100
    assert rows["connect.unsplit"]["us_per_conn"] == pytest.approx(170.0)


def test_a_pooler_opening_a_few_server_connections_does_not_set_the_divisor(tmp_path):
    """pgbouncer -C with the probes always on: the pooler opened 15 server connections during the run (backends
    sampled unpaired) while 17,116 client connects were sampled. The thread's wait and the backends' own steps are
    per client connect: over the 15 backends thread_wait came out 1.7 s per connection and the view closed at
    +45,973 %; a backend's fork is in a client's connect only when the pooler had to open one for it."""
    fr = frame({"connect.client_total": (17_116, 330.0), "connect.hop_accept": (17_116, 60.0),
                "connect.fork": (15, 450.0), "connect.first_run": (15, 100.0),
                "connect.backend_init_auth": (15, 1800.0)},
               {"starts": 17_116, "sampled": 0, "unpaired_sampled": 15})
    wait = pd.DataFrame([{"step": "connect.thread_wait", "kind": "latency", "per": "total", "count": 31_698,
                          "sum_ns": 17_116 * 1_500_000, "hist": None}])
    s = {}
    V.add_connection_setup(s, make_rundir(tmp_path, pd.concat([fr, wait], ignore_index=True), txns=17_116))
    rows = {r["name"]: r for r in s["connection_setup"]}
    assert rows["connect.thread_wait"]["us_per_conn"] == pytest.approx(1500.0)    # was 1.7 s: over 15
    assert rows["connect.fork"]["us_per_conn"] == pytest.approx(450.0 * 15 / 17_116, abs=0.01)
    assert rows["connect.fork"]["divisor"] == 17_116 and rows["connect.fork"]["backends"] == 15
    assert rows["connect.fork"]["p50_us"] > 300        # a backend's own fork is still described per backend
    # the client's connect still adds up: unsplit is what the backends' share and the hop's accept leave of it
    own = ("connect.unsplit", "connect.hop_accept") + V.BACKEND_STEPS
    assert sum(rows[n]["us_per_conn"] for n in own) == pytest.approx(330.0, abs=0.05)
    # and no step is over another divisor than the client connects (closure.connect_divisors would name it)
    assert {r["divisor"] for r in s["connection_setup"]} == {17_116}


def test_a_hops_accept_queue_is_named_and_taken_out_of_the_unsplit_connect():
    """pgpool with every child busy: the client's connection waits in the hop's accept queue (connect.hop_accept),
    measured without pairing the client, like the backend's own steps; what stays unsplit is the rest."""
    fr = frame({"connect.client_total": (50, 9000.0), "connect.hop_accept": (50, 6000.0),
                "connect.fork": (50, 200.0), "connect.first_run": (50, 100.0),
                "connect.backend_init_auth": (50, 1000.0)})
    rows = V._unsplit(fr, V.connection_setup_view(fr, 50))
    by = {r["name"]: r["us_per_conn"] for r in rows}
    assert by["connect.hop_accept"] == pytest.approx(6000.0)
    assert by["connect.unsplit"] == pytest.approx(9000.0 - 6000 - 200 - 100 - 1000)
    assert sum(by.values()) == pytest.approx(9000.0)      # the setup still adds up to the client's connect
    assert [r["name"] for r in rows][:3] == ["connect.unsplit", "connect.hop_accept", "connect.fork"]


def test_a_stray_pairing_through_a_hop_is_not_added_on_top_of_the_unsplit_connect():
    """pgpool, 4 -C clients: one of 962 connections came out paired with a backend (bench/closure 2026-11-25), so
    connect.tcp_handshake and connect.accept had one sample each (8,437 and 384 µs) while connect.unsplit, the
    client's own connect minus what is measured without pairing, already holds every connection's handshake and
    accept: the view closed at +108.5 % (the divisor check said +2.4 % over the transactions). Steps that need a
    pairing are inside connect.unsplit when it is made, so they leave the sum."""
    fr = frame({"connect.client_total": (962, 5200.0), "connect.hop_accept": (962, 600.0),
                "connect.fork": (961, 350.0), "connect.first_run": (961, 500.0),
                "connect.backend_init_auth": (961, 2100.0), "connect.tcp_handshake": (1, 8437.0),
                "connect.accept": (1, 384.0)})
    rows = V._unsplit(fr, V.connection_setup_view(fr, 962))
    by = {r["name"]: r["us_per_conn"] for r in rows}
    assert "connect.tcp_handshake" not in by and "connect.accept" not in by, by
    assert sum(by.values()) == pytest.approx(5200.0)      # the client's connect, once
    # a stray pair that got as far as its ReadyForQuery does not stand for the 961 others either
    stray = frame({**{r.step: (r.count, r.sum_ns / r.count / 1e3) for r in fr.itertuples() if r.kind != "stat"},
                   "connect.ready_delivery": (1, 50.0)})
    by = {r["name"]: r["us_per_conn"] for r in V._unsplit(stray, V.connection_setup_view(stray, 962))}
    assert "connect.unsplit" in by and "connect.ready_delivery" not in by and sum(by.values()) == pytest.approx(5200)


def test_setup_stages_are_connect_leg_rows_per_transaction():
    rows = V.setup_stages(V.connection_setup_view(frame(UNIX), 100))
    assert [r["leg"] for r in rows] == ["connect"] * 5
    assert {r["name"]: r["us_per_txn"] for r in rows}["connect.fork"] == pytest.approx(480.0)
    assert all(r["count_per_txn"] == 1.0 for r in rows)


def test_summary_folds_the_setup_into_the_latency_closure(tmp_path):
    """A -C run directory: the per-message stages (setup exchange left out by the probes) plus the setup steps
    are the latency view, and the closure is taken against the cycle with both."""
    from pathprof.analysis.summary import summarize
    rd = RunDir.create(tmp_path, "loopback")
    rd.update(workload={"clients": 1, "connect": True, "duration_s": 5},
              pgbench={"result": {"tps": 250.0, "transactions": 100, "failed": 0, "connection_time_ms": 2.9,
                                  "latency_ms": {"mean": 0.9}}},
              probes={"level": "basic"})
    rd.write_frame("stages.parquet", pd.DataFrame([
        {"kind": "proc", "role": "backend", "leg": "server", "hop": "", "hook": "", "netns": "", "dev": "",
         "count": 100, "sum_ns": 100 * 1_000_000, "hist": None}]))
    rd.write_frame("connect.parquet", frame(UNIX))
    s = summarize(RunDir.open(rd.path))
    names = [(x["name"], x["leg"]) for x in s["stages"]]
    assert ("backend.execute", "server") in names and ("connect.backend_init_auth", "connect") in names
    total = 1000 + 180 + 480 + 150 + 2000 + 80
    assert s["closure"]["stages_sum_us"] == pytest.approx(total)
    assert s["closure"]["latency_error_pct"] == pytest.approx((total - 4000) / 4000 * 100, abs=0.01)


def retx_row(name: str, count: int, sum_ms: float) -> dict:
    return {"step": name, "kind": "latency", "per": "total", "count": count, "sum_ns": int(sum_ms * 1e6), "hist": None}


def test_handshake_retransmission_waits_are_spread_over_the_connections_sampled(tmp_path):
    """connect.syn_retx comes only from the connections whose handshake waited (2 of 100, 1 s each): per
    transaction it is their sum over all 100 sampled, 20 ms, with 0.02 of a wait per transaction; it is first in the
    timeline, before the handshake's last trip."""
    steps = dict(UNIX, **{"connect.tcp_handshake": (100, 40.0)})
    fr = pd.concat([frame(steps, {"sampled": 100, "matched": 100, "syn_retransmits": 2, "synack_retransmits": 1}),
                    pd.DataFrame([retx_row("connect.syn_retx", 2, 2000.0)])], ignore_index=True)
    s = {"closure": {"cycle_us": 40_000.0}}
    V.add_connection_setup(s, make_rundir(tmp_path, fr))
    rows = s["connection_setup"]
    assert [r["name"] for r in rows][:2] == ["connect.syn_retx", "connect.tcp_handshake"]
    assert rows[0]["us_per_conn"] == pytest.approx(20_000.0)
    assert V.setup_stages(rows)[0]["count_per_txn"] == pytest.approx(0.02)
    hs = V.connect_retransmits(s, {"pp-a": {"TCPSynRetrans": 2}, "pp-b": {"TCPSynRetrans": 1}})
    assert hs["syn"] == 2 and hs["synack"] == 1 and hs["kernel_syn_retrans"] == 3
    assert hs["wait_share_pct"] == pytest.approx(50.0) and hs["connections_waited"] == 2


def test_unsplit_leaves_out_the_handshake_retransmission_the_client_measured(tmp_path):
    """No backend paired with its client (NAT, a hop, the delay line's reinjection): connect.syn_retx is measured
    on the client alone and is inside its connect.client_total, so connect.unsplit must not hold it again."""
    steps = {k: v for k, v in UNIX.items() if k not in ("connect.accept", "connect.ready_delivery")}
    steps["connect.client_total"] = (100, 12_830.0)      # 10 ms of SYN waits + 2,630 own steps + 200 unsplit
    fr = pd.concat([frame(steps, {"unpaired_sampled": 100}), pd.DataFrame([retx_row("connect.syn_retx", 1, 1000.0)])],
                   ignore_index=True)
    s = {}
    V.add_connection_setup(s, make_rundir(tmp_path, fr))
    rows = {r["name"]: r["us_per_conn"] for r in s["connection_setup"]}
    assert rows["connect.syn_retx"] == pytest.approx(10_000.0)
    assert rows["connect.unsplit"] == pytest.approx(12_830.0 - 10_000.0 - 480 - 150 - 2000)


def test_no_handshake_retransmissions_no_entry():
    assert V.connect_retransmits({"connection_probe": {"counters": {"syn_retransmits": 0}}}, {}) is None


def test_a_setup_message_retransmission_moves_out_of_the_step_that_held_it():
    """The startup packet lost once (200 ms tail-loss probe) over 10 transactions: 20 ms per transaction out of
    connect.backend_init_auth; a lost hello: out of connect.ready_delivery. The setup's sum is unchanged."""
    setup = V.connection_setup_view(frame(UNIX), 100)
    before = sum(s["us_per_conn"] for s in setup)
    parts = [{"where": "init", "sum_ns": 10 * 150_000, "count": 1}, {"where": "hello", "sum_ns": 10 * 50_000,
                                                                      "count": 1}]
    rows = {s["name"]: s for s in V.split_setup_retx(setup, parts, 10)}
    assert rows["connect.setup_retx"]["us_per_conn"] == pytest.approx(200.0)
    assert rows["connect.backend_init_auth"]["us_per_conn"] == pytest.approx(2000.0 - 150.0)
    assert rows["connect.ready_delivery"]["us_per_conn"] == pytest.approx(80.0 - 50.0)
    assert sum(s["us_per_conn"] for s in rows.values()) == pytest.approx(before)
    # more than a step holds: it takes what the next one in line has, never below zero
    rows = {s["name"]: s for s in V.split_setup_retx(V.connection_setup_view(frame(UNIX), 100),
                                                       [{"where": "hello", "sum_ns": 10 * 100_000, "count": 1}], 10)}
    assert rows["connect.ready_delivery"]["us_per_conn"] == 0
    assert rows["connect.backend_init_auth"]["us_per_conn"] == pytest.approx(2000.0 - 20.0)


def test_the_report_says_what_setup_retransmissions_cost():
    from pathprof.analysis.report.run_view import connect_retransmit_line
    text = connect_retransmit_line({"syn": 18, "synack": 9, "setup_messages": 33, "wait_us_per_txn": 52715.4,
                                    "wait_share_pct": 73.2, "kernel_syn_retrans": 27, "listen_drops": 0,
                                    "by_stage": {"connect.syn_retx": 38404.6, "connect.setup_retx": 14310.9}})
    assert "18 SYN, 9 SYN-ACK, 33 setup messages" in text and "73.2 % of the cycle" in text
    assert "connect.syn_retx 38,404.6" in text and "the kernel counted 27" in text


def test_setup_steps_charged_by_the_windows_are_over_the_transactions_inside_them(tmp_path):
    """probes/conn_win.bpf.h charges every connection's steps with their part inside the windows (window_charged):
    a step's sum is then client time inside the windows, so it is divided by the transactions that ended inside
    them, as the cycle is (in_windows.client_s / txns), and not by its own count (every connection of the run).
    pgpool -C with 4 children for 32 clients: the start burst's 1-3 s handshake waits run into the first window."""
    fr = frame({"connect.client_total": (600, 10_000.0), "connect.syn_retx": (60, 1_000_000.0),
                "connect.hop_accept": (600, 2_000.0), "connect.fork": (8, 500.0)},
               {"starts": 600, "sampled": 0, "unpaired_sampled": 2, "clients_sampled": 150, "window_charged": 1})
    fr.loc[fr["step"] == "connect.syn_retx", "sum_ns"] = 30 * 10**9        # 30 client-s inside the windows
    fr.loc[fr["step"] == "connect.client_total", "sum_ns"] = 45 * 10**9
    fr.loc[fr["step"] == "connect.hop_accept", "sum_ns"] = 3 * 10**9
    fr.loc[fr["step"] == "connect.fork", "sum_ns"] = 1_000_000
    rd = RunDir.create(tmp_path, "pgpool")
    rd.update(pgbench={"result": {"transactions": 600, "failed": 0, "connection_time_ms": 70.0}},
              probes={"level": "basic", "in_windows": {"txns": 300, "client_s": 45.0}})
    rd.write_frame("connect.parquet", fr)
    s = {}
    V.add_connection_setup(s, RunDir.open(rd.path))
    rows = {r["name"]: r for r in s["connection_setup"]}
    assert rows["connect.syn_retx"]["us_per_conn"] == pytest.approx(100_000.0)      # 30 s / 300 txns
    assert rows["connect.hop_accept"]["us_per_conn"] == pytest.approx(10_000.0)
    assert rows["connect.fork"]["us_per_conn"] == pytest.approx(3.33, abs=0.01)     # no _per_client on top
    assert {r["divisor"] for r in s["connection_setup"]} == {300}
    # the waits counted (60) are of every connection of the run (600): their share per transaction is over those
    assert V.setup_stages([rows["connect.syn_retx"]])[0]["count_per_txn"] == pytest.approx(0.1)
    # the client's whole connect inside the windows, split: 45 s of client time over 300 transactions
    own = ("connect.unsplit", "connect.hop_accept", "connect.syn_retx", "connect.fork")
    assert sum(rows[n]["us_per_conn"] for n in own) == pytest.approx(150_000.0, abs=0.05)


def test_the_window_ring_keeps_an_always_on_window_from_pgbenchs_start():
    """ConnProbe.set_window: the windows the BPF side charges against, the open one ending at WIN_OPEN; opening an
    open window (always on: opened at pgbench's start, then by the session) keeps the earlier start."""
    import numpy as np
    from pathprof.agent.probing import conn as CP

    class Map:
        def __init__(self):
            self.value = None

        def update(self, key, value, flags=0):
            self.value = value

    probe = CP.ConnProbe(1, [5432])
    probe.obj = type("Obj", (), {"maps": {"win": Map(), "win_ring": Map()}})()
    ring = lambda: np.frombuffer(probe.obj.maps["win_ring"].value, np.uint64).reshape(2, CP.WIN_RING)  # noqa: E731
    probe.set_window(100)
    probe.set_window(200)                # the session opens its always-on window after pgbench's start
    assert ring()[0][0] == 100 and ring()[1][0] == CP.WIN_OPEN
    assert np.frombuffer(probe.obj.maps["win"].value, np.uint64)[0] == 100
    probe.set_window(0)
    assert 0 < ring()[1][0] < CP.WIN_OPEN
    for k in range(CP.WIN_RING + 3):     # windows: only the last WIN_RING are kept
        probe.set_window(1000 + k)
        probe.set_window(0)
    starts = ring()[0]
    assert list(starts) == [1000 + k for k in range(3, CP.WIN_RING + 3)]
    probe.obj = None
