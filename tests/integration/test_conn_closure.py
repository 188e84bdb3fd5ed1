"""A new connection per transaction (-C) over TCP and unix sockets: the connection-setup steps and the per-message
stages tile the client's cycle (clients / TPS) together, at 1 client and with several clients per pgbench thread.

What could go wrong, and is checked: the setup exchange counted twice (once by the connection probe, once as
messages: the startup packet's wait and the backend's start-up inside backend.execute), the time a client spends
between closing and being reconnected by its busy thread counted nowhere, and the connection probe describing
another stretch of the run than the per-message stages (it samples inside the same windows)."""
import json
import os
from pathlib import Path

import pytest
from conftest import run_pathprof

pytestmark = pytest.mark.integration
CLOSURE_PCT = 5.0
# TCP is the nic wire (loopback is the same TCP code without the veth: it adds run time, not coverage)
CELLS = [("unix", 1), ("nic", 1), ("nic", 12)]
SETUP = ["connect.accept", "connect.fork", "connect.first_run", "connect.backend_init_auth", "connect.ready_delivery",
         "connect.thread_wait"]


@pytest.fixture(scope="module")
def runs(connect_run):
    """The cells' runs (tests/conftest.py connect_run: shared with test_conn_probe)."""
    return {cell: connect_run(*cell) for cell in CELLS}


def stages(doc, leg=None) -> dict:
    return {s["name"]: s for s in doc["stages"] if not s.get("parent") and (leg is None or s["leg"] == leg)}


@pytest.mark.parametrize("cell", CELLS, ids=[f"{t}-{c}" for t, c in CELLS])
def test_setup_and_stages_tile_the_cycle(runs, cell):
    doc = runs[cell]
    cl = doc["closure"]
    assert cl["latency_basis"] == "cycle"
    total = sum(s["us_per_txn"] for s in doc["stages"] if not s.get("parent"))
    assert total == pytest.approx(cl["stages_sum_us"], abs=0.1)
    assert abs(cl["latency_error_pct"]) <= CLOSURE_PCT, (cell, cl, doc["connection_setup"],
                                                         doc["connection_probe"], doc["run_dir"])


@pytest.mark.parametrize("cell", CELLS, ids=[f"{t}-{c}" for t, c in CELLS])
def test_each_setup_step_is_a_stage_of_the_connect_leg(runs, cell):
    doc = runs[cell]
    connect = stages(doc, "connect")
    assert [n for n in SETUP if n not in connect] == [], connect
    assert ("connect.tcp_handshake" in connect) == (cell[0] != "unix")
    # the same figures as the connection-setup view (one connection per transaction)
    setup = {s["name"]: s["us_per_conn"] for s in doc["connection_setup"]}
    assert {n: s["us_per_txn"] for n, s in connect.items()} == setup
    counters = doc["connection_probe"]["counters"]
    for name in ("syn_retransmits", "synack_retransmits", "listen_overflows", "listen_drops", "sampled"):
        assert name in counters, counters
    assert counters["sampled"] > 0


@pytest.mark.parametrize("cell", CELLS, ids=[f"{t}-{c}" for t, c in CELLS])
def test_setup_exchange_is_not_counted_again_as_messages(runs, cell):
    """-M extended: one request/response per transaction. The startup packet -> hello exchange (and on TCP the
    SSLRequest -> 'N') would add one or two more backend.execute spans per transaction, holding the backend's
    start-up and authentication, already in connect.backend_init_auth."""
    st = stages(runs[cell])
    assert st["backend.execute"]["count_per_txn"] <= 1.2, st["backend.execute"]
    assert st["backend.execute"]["us_per_txn"] < st["connect.backend_init_auth"]["us_per_txn"]


@pytest.mark.parametrize("topology", ["nic"])
def test_clients_sharing_a_thread_wait_for_it(runs, topology):
    """12 clients on 2 pgbench threads: a client that closed waits while its thread connects and serves its other
    clients; alone on its thread it waits only for its own close()."""
    alone = stages(runs[(topology, 1)])["connect.thread_wait"]["us_per_txn"]
    shared = stages(runs[(topology, 12)])["connect.thread_wait"]["us_per_txn"]
    assert shared > 2 * alone, (alone, shared)


@pytest.mark.parametrize("topology", ["nic"])
def test_a_reply_waits_while_its_thread_connects_another_client(runs, topology):
    """A client's reply that arrives while its thread is blocked in another client's connect: connwait.pgbench, on
    the response leg. Alone on its thread a client never waits for another's connect: once (ci41x, --wipe) the
    1-client nic run had one such wait of ~25 µs in ~440 transactions (0.048 µs a transaction against a ~3-ms
    cycle; not understood yet: a connect whose end the thread's hello read did not mark?). So alone it may be
    there only as such a stray: at most 1 % of transactions and 0.1 % of the cycle."""
    shared = stages(runs[(topology, 12)], "response")
    assert shared.get("connwait.pgbench", {}).get("us_per_txn", 0) > 0, shared
    alone = runs[(topology, 1)]
    stray = stages(alone).get("connwait.pgbench")
    assert stray is None or (stray["count_per_txn"] <= 0.01 and
                             stray["us_per_txn"] <= 0.001 * alone["closure"]["cycle_us"]), (stray, alone["run_dir"])


def test_a_hop_that_reads_the_terminate_with_the_fin_does_not_count_it(connect_run):
    """docker-proxy (Go, woken late) reads a client's Terminate together with the FIN right behind it: 6 bytes of
    sequence space, not the Terminate's 5. Counted as a request, its wait and forwarding (which the client never
    waits for: it is already connecting again) ran into the next connection's setup: +7 .. +12 % closure."""
    doc = connect_run("docker-dnat", 1)
    cl = doc["closure"]
    assert abs(cl["latency_error_pct"]) <= CLOSURE_PCT, (cl, doc["run_dir"])
    hop = {s["leg"]: s for s in doc["stages"] if s["name"] == "wakeup.docker-proxy"}
    assert hop["request"]["count_per_txn"] <= 1.1, hop     # the query's wait only (was ~1.85: + the Terminate)


def test_a_hop_reading_the_servers_fin_or_forwarding_a_terminate_counts_neither(connect_run):
    """After the client's Terminate the backend exits and its FIN comes back to docker-proxy, which reads it while
    the client is already connecting again; and a proxy thread that forwarded the Terminate went on to send the next
    connection's setup without a read or a sleep in between. Both were counted as the transaction's stages (the FIN
    as a second reply read, 2.0 waits per transaction on the response leg; the next send as a continued forward of
    the Terminate, hop.docker-proxy 1.08 .. 1.12 on the request leg): +2.6 .. +4.4 % closure alone, +5.07 % once
    beside another load. Both are the connection probe's time (connect.thread_wait, connect.unsplit)."""
    doc = connect_run("docker-dnat", 1)
    counts = {(s["leg"], s["name"]): s["count_per_txn"] for s in doc["stages"]}
    waits = sum(counts.get(("response", f"{n}.docker-proxy"), 0) for n in ("idle_exit", "wakeup", "queued"))
    assert waits <= 1.1, (waits, doc["run_dir"])           # the reply's wait only (was 2.0: + the FIN's)
    assert counts[("request", "hop.docker-proxy")] <= 1.05, (counts, doc["run_dir"])


def test_a_poolers_own_queries_are_not_a_transactions(connect_run):
    """pgbouncer (session pooling) under -C: when a client leaves, pgbouncer resets its server connection
    (DISCARD ALL) on its own while pgbench is already connecting again; and it reads the next client's first query,
    then SETs that client's parameters (application_name) on the server connection before it forwards the query.
    The reset is off the client's path; the SET's round trip is on it, but it is the pooler readying its server
    connection, not the transaction: the query waits in the pooler for it (poolwait.pgbouncer). Counted as the
    transaction's stages they over-closed the cycle by +13 .. +30 % (backend.execute 3.0 per transaction, the
    reset's and the SET's), then the SET's alone made backend.execute 2.0 and put its reply's forwarding upstream
    in hop.pgbouncer on the response leg (2.0 per transaction)."""
    doc = connect_run("pgbouncer", 1)
    cl = doc["closure"]
    assert abs(cl["latency_error_pct"]) <= CLOSURE_PCT, (cl, doc["run_dir"])
    ex = stages(doc)["backend.execute"]
    assert ex["count_per_txn"] <= 1.1, ex                  # the query only (was 2.0: + the SET)
    hop = {s["leg"]: s for s in doc["stages"] if s["name"] == "hop.pgbouncer"}
    assert hop["response"]["count_per_txn"] <= 1.1, hop    # the reply to the client only (was 2.0)
    wait = stages(doc, "request")["poolwait.pgbouncer"]
    assert 0.9 <= wait["count_per_txn"] <= 1.1, wait       # the SET's round trip, once per transaction


@pytest.mark.parametrize("topology", ["pgbouncer", "nic", "unix"])
def test_the_rest_of_the_terminates_send_is_the_clients(connect_run, topology):
    """Nobody answers the Terminate: after its delivery (inside pgbench's send, on a veth or loopback) the rest of
    the send (the softirq finishing, the pooler it woke running first on pgbench's CPU) is pgbench's own time up to
    connect.thread_wait, which starts at the send's end. In no stage it left pgbouncer -C at -3.4 % (~13 µs of a
    ~440-µs cycle, 2026-11-26), unix -C at -0.6 … -0.8 % (-0.1 % with it); now a third client.pgbench span per
    transaction (after the hello, after the result, after the Terminate's delivery)."""
    doc = connect_run(topology, 1)
    client = stages(doc, "client")["client.pgbench"]
    assert 2.9 <= client["count_per_txn"] <= 3.1, (client, doc["run_dir"])
    assert abs(doc["closure"]["latency_error_pct"]) <= CLOSURE_PCT, (doc["closure"], doc["run_dir"])


def test_clients_waiting_for_a_free_pgpool_child_is_a_named_setup_step(pgpool_children_run):
    """pgpool-II with fewer children than clients under -C: a child serves one client connection at a time, so the
    other clients' connections wait in pgpool's accept queue for a free child. That wait is connect.hop_accept (the
    hop's end established -> the hop's first read on it); before, it was inside connect.unsplit, unnamed. Ground
    truth: one child against four for 4 clients, the step carries at least 70 % of the cycle's growth (it carries
    more: with one child the backends start one at a time and their own steps get shorter)."""
    one, four = pgpool_children_run(1), pgpool_children_run(4)    # tests/conftest.py (test_pooler_counters too)
    # One child in 4 s runs does not hold the 5 % goal reliably: +1.2 ... +4.2 % in most runs, +14.0 % in one full
    # suite and -11.3 % in one 6 s bench cell (a SYN dropped by pgpool's short listen queue: a 1 s wait) on
    # 2026-11-25; four children hold it. The ground truth below (the named wait carries the gap) holds in all.
    for doc, bound in ((one, 20.0), (four, CLOSURE_PCT)):
        assert abs(doc["closure"]["latency_error_pct"]) <= bound, (doc["closure"], doc["run_dir"])
    gap = one["closure"]["cycle_us"] - four["closure"]["cycle_us"]
    wait = {n: stages(doc, "connect")["connect.hop_accept"]["us_per_txn"] for n, doc in ((1, one), (4, four))}
    assert gap > 0, (one["closure"], four["closure"])
    assert wait[1] - wait[4] >= 0.7 * gap, (wait, gap)
    # it is taken out of what stays unsplit, not added on top of it
    setup = {s["name"]: s["us_per_conn"] for s in one["connection_setup"]}
    assert setup["connect.unsplit"] < setup["connect.hop_accept"], setup


def test_a_poolers_clients_wait_for_their_thread_per_client_connect(tmp_path):
    """pgbouncer, transaction pooling with a pool of 2, 16 -C clients on 2 pgbench threads, probes always on: the
    pooler opens its server connections once (1 backend forked in the run) while the clients connect ~20,000 times.
    connect.thread_wait (a client's Terminate -> its thread starts its next connect) and the backends' own steps
    were divided by the backends sampled, not by the clients' connects: thread_wait 25.4 s per connection, closure
    +819,330 % (with the default windows no backend started inside them, so it closed). Ground truth from
    pgbench's own figures: between two transactions a client is connecting (pgbench's average connection time) or
    in its transaction (pgbench's latency), and the rest of its cycle is the wait for its thread, which the stage
    must carry (it also holds the close(), which pgbench's connection time counts)."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    cp = run_pathprof("run", "--topology", "pgbouncer", "--option", "pool_mode=transaction", "--option",
                      "pool_size=2", "--clients", "16", "--connect", "--mode", "extended", "--duration", "4",
                      "--probe-duty", "100", "--json", "--no-live", runs_dir=tmp_path / "runs")
    assert cp.returncode == 0, cp.stderr[-3000:]
    doc = json.loads(cp.stdout)
    cl = doc["closure"]
    assert abs(cl["latency_error_pct"]) <= CLOSURE_PCT, (cl, doc["run_dir"])
    assert "connect_divisors" not in cl, cl["connect_divisors"]     # every step is per client connect
    setup = {s["name"]: s for s in doc["connection_setup"]}
    # the pooler's backends are far fewer than the clients' connects: their steps are spread over the latter
    fork = setup.get("connect.fork")
    assert fork is None or fork["count"] < 0.1 * fork["divisor"], fork
    wait = setup["connect.thread_wait"]["us_per_conn"]
    between = cl["cycle_us"] - doc["latency_ms"]["mean"] * 1000 - cl["connection_measured_us"]
    assert between > 0.2 * cl["cycle_us"], (between, cl)     # 8 clients a thread: the wait is a real share
    assert 0.7 * between <= wait <= between + cl["connection_measured_us"] + 0.1 * cl["cycle_us"], (wait, between, cl)


LISTEN_QUEUE_CLOSURE_PCT = 9.0
SMALL_QUEUE_SYSCTLS = """
[[sysctls]]
host = "server"
name = "net.core.somaxconn"
value = "1"

[[sysctls]]
host = "server"
name = "net.ipv4.tcp_syncookies"
value = "0"
"""


def test_listen_queue_overflow_is_named_and_timed(tmp_path):
    """The nic path with the server namespace's listen queue cut to 1 (somaxconn) and no SYN cookies, 16 clients on
    8 pgbench threads: SYNs are dropped while the postmaster is busy forking. The probe counts the clients' SYN
    retransmits within what the kernel counts (TcpExt ListenOverflows, ListenDrops), and each costs the client its
    initial retransmission timeout (1 s), inside connect.tcp_handshake."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    spec = Path(__file__).resolve().parents[2] / "topologies" / "nic.toml"
    text = spec.read_text().replace('name = "nic"', 'name = "nic-smallq"').replace("pp-nic-", "pp-nsq-")
    path = tmp_path / "nic-smallq.toml"
    path.write_text(text + SMALL_QUEUE_SYSCTLS)
    cp = run_pathprof("run", "--topology", str(path), "--clients", "16", "--threads", "8", "--connect",
                      "--duration", "4", "--probe-duty", "100", "--json", "--no-live", runs_dir=tmp_path / "runs")
    assert cp.returncode == 0, cp.stderr[-3000:]
    doc = json.loads(cp.stdout)
    c = doc["connection_probe"]["counters"]
    assert c["listen_overflows"] > 0 and c["syn_retransmits"] > 0, c
    # two clients a thread: while one waits seconds for its SYN, the other waits for the thread before its first
    # connect. That wait is in the cycle (pgbench's log: each client from the run's first transaction) and was in no
    # stage: -10.8 ... -18.0 % alone (stop 43); now in connect.thread_wait: -1.2 ... -4.1 % alone (8 runs),
    # -2.8 ... +0.4 % beside a 16-client run (12, bench/truth_trials --beside), but -7.4 and -5.6 % in one CI
    # round (ci44b; the premise's remake is at 5 %). The bound sits between what CI saw and the old miss
    assert abs(doc["closure"]["latency_error_pct"]) <= LISTEN_QUEUE_CLOSURE_PCT, (doc["closure"], doc["run_dir"])
    # the kernel's own counter bounds the probe's: every SYN the client sent again had been dropped by the listener
    # (ListenDrops, overflows included). Not every overflow makes a SYN retransmit: a dropped final ACK is made
    # good by the client's first data segment
    assert c["syn_retransmits"] <= c["listen_drops"] + 2, c
    setup = {s["name"]: s for s in doc["connection_setup"]}
    syn = setup["connect.syn_retx"]
    # every connection whose SYN was sent again waited at least the 1 s initial timeout: in connect.syn_retx (always
    # on, every wait is inside the window, opened at pgbench's start), its share over the run's connections;
    # what is left in connect.tcp_handshake is the last trip: ~16 µs a connection here against ~12 ms in syn_retx
    # (before the split: ~13.6 ms in the handshake). Bounded against syn_retx, not in µs: once in CI (stop 31,
    # alone) ~2 s of the run's ~25 SYN waits stayed in the handshake (1054 µs a connection), not reproduced in 10
    # runs; a split that took none out leaves syn_retx empty and fails here
    assert c["handshake_retx_sampled"] > 0, c
    assert syn["us_per_conn"] * syn["sampled"] >= 0.9 * c["handshake_retx_sampled"] * 1e6, (syn, c)
    assert setup["connect.tcp_handshake"]["us_per_conn"] < 0.15 * syn["us_per_conn"], setup
    r = doc["connect_retransmits"]
    assert r["syn"] + r["synack"] == pytest.approx(r["kernel_syn_retrans"], abs=max(2, 0.1 * r["kernel_syn_retrans"]))


def test_a_setup_step_over_the_wrong_connections_is_named(runs, tmp_path):
    """The gap locator's divisor check on a real run (#22.4): nic, 12 -C clients, one probe window of the run. As
    recorded, every setup step is a mean over the connections the window sampled, i.e. per transaction measured:
    nothing to say. The same run with the probe's sampled-connection counters taken out divides the aggregate
    steps (connect.thread_wait) by every connection of the run (pgbench's transactions), as pgbouncer -C did before
    (thread_wait 15 µs for 41): the locator must name that step, its divisor, and the closure either way."""
    import shutil

    import pandas as pd
    doc = runs[("nic", 12)]
    assert "connect_divisors" not in doc["closure"], doc["closure"]
    bad = tmp_path / "run"
    shutil.copytree(doc["run_dir"], bad)
    frame = pd.read_parquet(bad / "connect.parquet")
    frame = frame[~frame["step"].isin(["sampled", "unpaired_sampled", "clients_sampled", "window_charged",
                                       "connect.client_total"])]
    frame.to_parquet(bad / "connect.parquet")
    cp = run_pathprof("report", str(bad), "--json")
    assert cp.returncode == 0, cp.stderr[-2000:]
    found = json.loads(cp.stdout)["closure"]["connect_divisors"]
    steps = {r["step"]: r for r in found["steps"]}
    assert "connect.thread_wait" in steps, found
    everyone = doc["connection_probe"]["connections"]
    assert steps["connect.thread_wait"]["divisor"] == everyone > 1.3 * found["txns"], (found, everyone)
    assert found["shift_us_per_txn"] > 0 and found["txns"] == doc["closure"]["txns"], found
    assert f"{found['latency_error_pct_if_over_txns']:+.1f} %" in found["statement"]


PGPOOL_BURST = ["--topology", "pgpool", "--clients", "32", "--threads", "32", "--connect", "--mode", "extended",
                "--option", "children=4", "--duration", "4", "--json", "--no-live"]
# the client's connect through pgpool, unpaired: its SYN retransmission waits, the wait for a child, the rest
BURST_STEPS = ("connect.syn_retx", "connect.hop_accept", "connect.unsplit")


def test_setup_waits_that_began_before_a_window_opened_are_counted_from_its_start(tmp_path):
    """pgpool with 4 children for 32 -C clients (a thread each): pgpool's listen queue (2 x its children) overflows
    at pgbench's start, so most clients' first connects wait 1-3 s for SYN retransmissions, running into the first
    window. With the connection probe sampling only connections that started inside a window, those waits were in
    the cycle (the clients' time inside the windows) and in no stage: -11 ... -27.5 % with the default windows,
    +0.4 % always on. Each step of every connection is now charged with its part inside the windows
    (probes/conn_win.bpf.h). Ground truth: the run always on, where every wait is inside the one window. The
    client's connect (syn_retx + hop_accept + unsplit) takes the same share of the cycle in both, within 5 points of
    it (91.7-93.6 % windowed in four runs against 92.9 / 93.1 % always on, 2026-11-25; before, the windowed share
    was 72 %: 21 points short), and the windowed run closes within the 5 % goal."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    docs = {}
    for name, extra in (("windowed", []), ("always_on", ["--probe-duty", "100"])):
        cp = run_pathprof("run", *PGPOOL_BURST, *extra, runs_dir=tmp_path / name)
        assert cp.returncode == 0, cp.stderr[-3000:]
        docs[name] = json.loads(cp.stdout)
    win, on = docs["windowed"], docs["always_on"]
    assert not win["windows"].get("always_on") and on["windows"].get("always_on"), (win["windows"], on["windows"])
    assert win["connection_probe"]["counters"]["syn_retransmits"] > 0, win["connection_probe"]["counters"]
    for doc in (win, on):
        assert abs(doc["closure"]["latency_error_pct"]) <= CLOSURE_PCT, (doc["closure"], doc["connection_setup"],
                                                                          doc["run_dir"])

    def share(doc):
        connect = stages(doc, "connect")
        return sum(connect[n]["us_per_txn"] for n in BURST_STEPS if n in connect) / doc["closure"]["cycle_us"]
    assert share(win) == pytest.approx(share(on), abs=0.05), (share(win), share(on), win["connection_setup"],
                                                               on["connection_setup"])
