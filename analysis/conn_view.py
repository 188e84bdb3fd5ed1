"""The connection-setup view of runs that open a new connection per transaction (pgbench -C, `--connect`).

Read from `connect.parquet` (written by pathprof.agent.probing.conn, one row per step). Steps on the client's
path, back to back, so they add up to `connect.total` (the client's connect() call -> it has read the first
ReadyForQuery) -- `summary["connection_setup"]`, µs per connection:

  connect.syn_retx           client SYN_SENT -> the handshake's last retransmission (TCP only, connections
                             that had one; per connection sampled): a SYN or SYN-ACK lost on the wire, or a SYN
                             a full listen queue dropped, waits for a retransmission timer (1 s, then 2 s ...).
                             The client's SYN again or the server's SYN-ACK again (paired by the server's
                             initial sequence number, so NAT does not matter); emitted by the client alone.
                             Counted (`connection_probe.counters`: syn_retransmits -- syn_retransmits_sampled
                             of connections sampled --, synack_retransmits, handshake_retx_sampled: connections
                             sampled that waited, and the server namespace's listen_overflows / listen_drops)
  connect.tcp_handshake      client SYN_SENT (or the handshake's last retransmission) -> client ESTABLISHED
                             (TCP only; absent on unix sockets): the handshake's trip
  connect.synack_retx        client ESTABLISHED -> the last retransmission before the postmaster's accept()
                             took the connection (the server's SYN-ACK again, or the client's first data
                             again): its final ACK was dropped by a full accept queue (ListenOverflows) or
                             lost. Paired connections only (synack_retx_sampled); else inside connect.unsplit
  connect.setup_retx         a setup message (SSLRequest, its refusal, the startup packet, the hello) that reached
                             its receiver only with a retransmission: its send -> that retransmission, timed by
                             the per-message probe (probes/tcp_loss.bpf.h) and moved out of the step that held it
                             (backend_init_auth; ready_delivery or unsplit for the hello): split_setup_retx
  connect.hop_accept         a hop's end of the connection established -> the hop's first read on it (any of its
                             processes): its accept queue, its accept, its read of the client's first message.
                             pgpool-II with fewer children (num_init_children) than clients: the wait for a free
                             child. Only on a path with a hop; subtracted from connect.unsplit, which holds it
  connect.accept             handshake done (TCP) / connect() called (unix) -> the postmaster's accept()
                             returns: the accept queue (the postmaster waking from its select(), or busy forking
                             for earlier connections) and the accept itself
  connect.fork               accept() returned -> fork() done in the postmaster (per-connection bookkeeping
                             and copying the postmaster's address space: page tables, shared memory mappings)
  connect.first_run          fork -> the new backend first on a CPU (run-queue wait of a new task)
  connect.backend_init_auth  first run -> ReadyForQuery queued on the client's socket: the backend reads the
                             startup packet, attaches to shared memory, builds its catalog caches (InitPostgres),
                             authenticates, reports its settings. On TCP it includes libpq's SSLRequest round
                             trip (sslmode=prefer; the server's 'N' refusal is recognised and skipped). With
                             password methods the first message is the challenge, so the rest of the exchange
                             lands in ready_delivery; pathprof's own server uses trust.
  connect.ready_delivery     ReadyForQuery queued -> the client's recv returned it (wakeup, run queue, recv)
  connect.thread_wait        the client sent its Terminate (PQfinish) -> its pgbench thread starts its next
                             connect: the close(), then, with several clients on a thread, the wait while the
                             thread serves its other clients first (their connects block it: libpq's connect is
                             synchronous). Measured as the thread's closed clients integrated over the window
                             (no client identity needed), divided by the connections sampled. It also holds each
                             client's wait before its first connect, while its thread connected its other
                             clients first (seconds when one of them waits for a dropped SYN)
  connect.unsplit            only when no backend could be paired with its client (a hop such as docker-proxy
                             or a pooler between them: the backend's client is the hop's own connection; NAT and
                             delay lines pair by the server's initial sequence number, paired_by_isn): the
                             client's own connect time (connect.client_total: connect start -> its read of the
                             hello) minus the backend's steps above (fork, first_run, backend_init_auth), which
                             are measured without a client: handshakes, accept queues, the hop accepting and
                             dialing upstream, the hello's way back (connect.syn_retx, measured on the client
                             alone, is left out of it)

The summary also puts these steps into the latency view (leg `connect`, µs per transaction = µs per
connection): the per-message stages leave the setup exchange to this probe (probes/msg.bpf.h, conn_split), so
the two tile the client's cycle together (`closure.latency_error_pct`, against the clients' time inside the
windows over the transactions inside them). Each step of every connection of the run is charged with its part
inside the measurement windows (probes/conn_win.bpf.h; counter `window_charged`), so a wait that began before a
window opened counts from its start, like the cycle: the steps' sums are divided by the transactions inside the
windows. Their histograms (p50/p99, count) are of the steps' whole lengths, every connection of the run. The CPU
and off-path figures are of the connections that started inside a window (counters `sampled`, `clients_sampled`).
Runs recorded before (no `window_charged`) sampled the connections that started inside a window, divided by them.

The sum without connect.thread_wait compares with pgbench's `average connection time` (`connection_time_ms`
in run.json/summaries), which times PQconnectdb *and* PQfinish per transaction (`closure.connection_error_pct`).
pgbench's figure is of the whole run, this probe's of the windows: with measurement windows it is scaled to them
by the ratio of the cycles (the whole run's TPS over the windows', `closure.connection_measured_in_windows_us`),
so a window slower than the rest of the run (the probes' cost, a load that came and went) does not show as error.

Off the client's path -- `summary["connection_async"]`, not part of the sum:

  connect.first_query        backend received its first query -> sent the result (cold caches: compare with
                             the warm backend.execute stage of a run without --connect; inside pgbench's
                             per-transaction latency, so it is already in the latency view)
  connect.teardown           backend's last receive (libpq's Terminate) -> the dead backend leaves the CPU
                             (proc_exit callbacks, unmapping shared memory, closing the socket). The client
                             does not wait for it, but it takes CPU from the next connection.
  connect.reap               backend gone -> the postmaster's waitpid() returns it (0 when reaped first)

CPU per connection -- `summary["connection_cpu"]` (on-CPU µs, from sched_switch):
  cpu.client_connect (pgbench thread, connect start -> ReadyForQuery read), cpu.backend_init (backend first run
  -> ready), cpu.backend_first_query, cpu.backend_exit (after the last receive), cpu.backend_total (whole life),
  cpu.postmaster (all postmaster CPU / connections: accept, fork, reaping, SIGCHLD handling).
"""
from __future__ import annotations

import pandas as pd
from pathprof.analysis.histogram import quantile as hist_quantile
from pathprof.analysis.run_model import LoadResult

SETUP_STEPS = ["connect.syn_retx", "connect.tcp_handshake", "connect.synack_retx", "connect.hop_accept",
               "connect.accept", "connect.fork", "connect.first_run", "connect.backend_init_auth",
               "connect.ready_delivery", "connect.thread_wait"]
BACKEND_STEPS = ("connect.fork", "connect.first_run", "connect.backend_init_auth")   # need no client pairing
CLIENT_STEPS = ("connect.syn_retx",)      # measured on the client alone: inside connect.client_total too
# inside the client's connect and timed without pairing either: a hop's accept queue (pgpool's wait for a child)
HOP_STEPS = ("connect.hop_accept",)
RETX_STEPS = ("connect.syn_retx", "connect.synack_retx")   # only the connections that had one
# timed only on a client paired with its backend: inside connect.unsplit whenever that is made
PAIRED_STEPS = ("connect.tcp_handshake", "connect.synack_retx", "connect.accept", "connect.ready_delivery")
SETUP_RETX = ("connect.setup_retx",)      # from the per-message probe: split_setup_retx
CONNECT_LEG = "connect"
NOT_IN_PGBENCH_CONNECTION_TIME = ("connect.thread_wait",)     # the latency view's leg of the setup steps (stages.py)
ASYNC_STEPS = ["connect.first_query", "connect.teardown", "connect.reap"]
CPU_STEPS = ["cpu.client_connect", "cpu.backend_init", "cpu.backend_first_query", "cpu.backend_exit",
             "cpu.backend_total", "cpu.postmaster"]
WINDOW_CHARGED = "window_charged"     # pathprof.agent.probing.conn: the setup sums are their parts inside the windows
LOSS_STATS = ("tasks_full", "pending_full", "out_of_order", "accept_lost", "no_peer",
              "recursion_misses")


def _rows(frame: pd.DataFrame | None, names: list[str], connections: int, txns_in_windows: int = 0) -> list[dict]:
    """txns_in_windows: the sums are the steps' parts inside the windows (WINDOW_CHARGED), divided by these."""
    if frame is None or not len(frame):
        return []
    by = {r.step: r for r in frame.itertuples(index=False)}
    out = []
    for name in names:
        r = by.get(name)
        if r is None or not r.count:
            continue
        # one sample per connection: the mean over the connections seen; an aggregate: over all connections;
        # charged by the windows: the time inside them over the transactions inside them
        per_total = getattr(r, "per", "conn") == "total"
        denom = txns_in_windows or (connections if per_total else r.count)
        if not denom:
            continue
        hist = None if per_total else getattr(r, "hist", None)
        p50, p99 = hist_quantile(hist, 0.5), hist_quantile(hist, 0.99)
        out.append({"name": name, "us_per_conn": round(r.sum_ns / denom / 1e3, 2),
                    "p50_us": None if p50 is None else round(p50 / 1e3, 2),
                    "p99_us": None if p99 is None else round(p99 / 1e3, 2),
                    "count": int(r.count), "divisor": int(denom)})   # the connections it is a mean over
        if name in RETX_STEPS and not txns_in_windows:
            out[-1]["sampled"] = int(denom)     # the connections its mean is over (count of them waited)
    return out


def _unsplit(frame: pd.DataFrame | None, setup: list[dict], txns_in_windows: int = 0) -> list[dict]:
    """No backend paired with its client (a hop or NAT between them: the hello wakes the hop's socket, or the ports
    differ): the client's own connect.client_total minus the backend's steps becomes `connect.unsplit`, so the
    setup still adds up to what the client waited. It holds every connection's handshake and accept, so the steps
    of a stray pairing (one of 962 through pgpool: +108 % closure) leave the sum."""
    paired = next((s["count"] for s in setup if s["name"] == "connect.ready_delivery"), 0)
    total = _rows(frame, ["connect.client_total"], 0, txns_in_windows)
    # paired paths pair >= 99.7 % of their connections (73 recorded -C runs): a few stray pairs are not a split
    if not total or paired >= 0.5 * total[0]["count"]:
        return setup
    # charged by the windows, a backend's time is already over the transactions inside them: no _per_client
    setup = [_per_client(s, total[0]["count"]) if s["name"] in BACKEND_STEPS and not txns_in_windows else s
             for s in setup if s["name"] not in PAIRED_STEPS]
    own = sum(s["us_per_conn"] for s in setup if s["name"] in BACKEND_STEPS + CLIENT_STEPS + HOP_STEPS)
    row = {**total[0], "name": "connect.unsplit", "us_per_conn": round(max(total[0]["us_per_conn"] - own, 0.0), 2),
           "p50_us": None, "p99_us": None}
    return [row] + setup


def _per_client(step: dict, clients: int) -> dict:
    """A backend's own step (fork, first run, start-up) on a path where no backend pairs with its client: a pooler
    opens a server connection for some client connections only (pgbouncer keeps and reuses them: 15 backends for
    17,116 client connections in 4 s of -C), so the client waited for it that rarely. Its time over the window
    divided by the client connections sampled is what it adds to a client's connect on average; divided by its
    own count (a mean per backend) it was added in full to every connection. p50/p99 stay per backend."""
    if not clients or step["count"] >= clients:
        return step
    return {**step, "us_per_conn": round(step["us_per_conn"] * step["count"] / clients, 2), "divisor": int(clients),
            "backends": int(step["count"])}


def connection_setup_view(frame: pd.DataFrame | None, connections: int, txns_in_windows: int = 0) -> list[dict]:
    """Steps on the client's connect path, in timeline order: [{name, us_per_conn, p50_us, p99_us, count}]."""
    return _rows(frame, SETUP_STEPS, connections, txns_in_windows)


def connection_async_view(frame: pd.DataFrame | None, connections: int) -> list[dict]:
    return _rows(frame, ASYNC_STEPS, connections)


def connection_cpu_view(frame: pd.DataFrame | None, connections: int) -> list[dict]:
    return _rows(frame, CPU_STEPS, connections)


def setup_stages(setup: list[dict]) -> list[dict]:
    """The setup steps as latency-view rows (leg `connect`): one connection per transaction, so µs per connection
    is µs per transaction. The per-message stages leave the setup exchange out (probes/msg.bpf.h, conn_split), so
    together they tile the client's cycle."""
    return [{"name": s["name"], "leg": CONNECT_LEG, "us_per_txn": s["us_per_conn"], "p50_us": s.get("p50_us"),
             "p99_us": s.get("p99_us"),
             "count_per_txn": round(s["count"] / s["sampled"], 4) if s.get("sampled") else 1.0} for s in setup]


def probe_counters(frame: pd.DataFrame | None) -> dict:
    if frame is None or not len(frame):
        return {}
    st = frame[frame["kind"] == "stat"]
    return {str(r.step): int(r.count) for r in st.itertuples(index=False)}


def _step_count(frame, name: str) -> int:
    """Samples of one step (one per connection sampled for the per-connection steps), 0 when absent."""
    rows = frame[frame["step"] == name]
    return int(rows["count"].sum()) if len(rows) else 0


def add_connection_setup(summary: dict, rd) -> None:
    """Fill summary["connection_setup"] (and _async, _cpu, the probe's counters) and
    summary["closure"]["connection_error_pct"] from the run directory's connect.parquet; no-op without it."""
    frame = rd.read_frame("connect.parquet")
    if frame is None or not len(frame):
        return
    run = rd.run
    res = run.pgbench.result or LoadResult()
    # pgbench -C opens one connection per transaction (failed ones included)
    connections = int((res.transactions or 0) + (res.failed or 0))
    counters = probe_counters(frame)
    # aggregates (connect.thread_wait, cpu.postmaster, the retransmission waits) are per connection sampled inside
    # the windows: the clients' connects sampled (connect.client_total), else the backends sampled. Over all of
    # pgbench's connections a pooler's thread_wait came out as small as the windows' share of the run (pgbouncer
    # -C, 1 client, 2 s windows of a 5 s run: 15 us for 41, closure -9 %); over the backends, as large as the
    # clients' connects outnumber them where a pooler keeps its server connections (pgbouncer -C, probes always
    # on: 15 backends for 17,116 connects, thread_wait 1.7 s per connection, closure +45,973 %)
    charged = counters.get(WINDOW_CHARGED) and run.probes.in_windows and run.probes.in_windows.txns
    txns_in = int(run.probes.in_windows.txns) if charged else 0
    # charged by the windows (probes/conn_win.bpf.h), connect.client_total counts every connection of the run: the
    # CPU and off-path figures are of the clients whose connect started inside a window (clients_sampled)
    per_total = ((counters.get("clients_sampled") if charged else _step_count(frame, "connect.client_total"))
                 or counters.get("sampled", 0) + counters.get("unpaired_sampled", 0) or connections)
    setup = _unsplit(frame, connection_setup_view(frame, per_total, txns_in), txns_in)
    if txns_in:     # the waits counted are of every connection of the run: their share is over all of them
        setup = [{**s, "sampled": connections} if s["name"] in RETX_STEPS and connections else s for s in setup]
    if not setup:
        return
    summary["connection_setup"] = setup
    summary["connection_async"] = connection_async_view(frame, per_total)
    summary["connection_cpu"] = connection_cpu_view(frame, per_total)
    matched = counters.get("matched", 0)
    summary["connection_probe"] = {
        "connections": connections, "matched": matched,
        "coverage_pct": round(matched / connections * 100, 1) if connections else None,
        "lost": {k: v for k, v in counters.items() if k in LOSS_STATS and v},
        "counters": counters,
        "cost_ns_per_conn": ((run.probes.conn_cost.run_time_ns if run.probes.conn_cost else None) or 0)
        / connections if connections else None,
    }
    # pgbench's connection time is its connects and closes; the wait for its thread between them is not in it
    total = sum(s["us_per_conn"] for s in setup if s["name"] not in NOT_IN_PGBENCH_CONNECTION_TIME)
    closure = summary.setdefault("closure", {})
    closure["connection_setup_us"] = round(total, 2)
    measured_us = None if res.connection_time_ms is None else res.connection_time_ms * 1000.0
    closure["connection_measured_us"] = reference = measured_us
    scale = windows_scale(run, res) if txns_in else None
    if reference and scale:
        reference *= scale
        closure["connection_measured_in_windows_us"] = round(reference, 2)
    closure["connection_error_pct"] = round((total - reference) / reference * 100, 1) if reference else None


def windows_scale(run, res: LoadResult) -> float | None:
    """pgbench's connection time is the whole run's; the steps are the windows' (charged by them). Where the
    windows ran slower than the run as a whole (the probes' cost, or another load on the machine that came and
    went: unix -C beside the other lane of the suite, 120 TPS in the window against 210 outside it), the
    connection took longer there too: pgbench's figure scaled by the cycles' ratio (whole run's TPS over the
    windows'), or None when the windows are the whole run or a rate is missing."""
    sched, inside = run.probes.schedule, run.probes.in_windows
    if sched is None or sched.always_on or inside is None or not inside.tps or not res.tps:
        return None
    return res.tps / inside.tps


# where a setup message's retransmission wait sits among the steps, by where it fell (probes/tcp_loss.bpf.h): into a
# backend (or the 1-byte SSL refusal, which the backend answers with its wait for the startup packet), or the hello
SETUP_RETX_FROM = {"init": ("connect.backend_init_auth", "connect.unsplit"),
                   "hello": ("connect.ready_delivery", "connect.unsplit", "connect.backend_init_auth")}


def split_setup_retx(setup: list[dict], parts: list[dict] | None, txns: int) -> list[dict]:
    """-C over a lossy path: a setup message (SSLRequest, its refusal, the startup packet, the hello) delivered only by
    a retransmission waited for it inside connect.backend_init_auth, connect.ready_delivery or connect.unsplit. The
    per-message probe times that wait (send -> last retransmission) and keeps it apart (`parts`, ns over the
    windows' `txns`); it moves out of the step that holds it into `connect.setup_retx`, so the sum is unchanged."""
    if not parts or not txns:
        return setup
    by = {s["name"]: s for s in setup}
    moved, count = 0.0, 0
    for p in parts:
        us = p["sum_ns"] / txns / 1e3
        count += p["count"]
        for name in SETUP_RETX_FROM.get(p["where"], SETUP_RETX_FROM["hello"]):
            s = by.get(name)
            take = min(us, s["us_per_conn"]) if s else 0.0
            if take > 0:
                s["us_per_conn"] = round(s["us_per_conn"] - take, 2)
                us -= take
                moved += take
    if moved <= 0:
        return setup
    row = {"name": "connect.setup_retx", "us_per_conn": round(moved, 2), "p50_us": None, "p99_us": None,
           "count": count, "sampled": int(txns), "divisor": int(txns)}
    at = next((i for i, s in enumerate(setup) if s["name"] in ("connect.backend_init_auth", "connect.unsplit")),
              len(setup))
    return setup[:at] + [row] + setup[at:]


def connect_retransmits(summary: dict, kernel: dict, setup_parts: list[dict] | None = None) -> dict | None:
    """What lost or dropped packets cost connection setup (-C over TCP): the probe's SYN and SYN-ACK retransmissions
    of the run, the kernel's own count in the path's namespaces (TcpExt TCPSynRetrans: both kinds, every socket
    there), the server's ListenOverflows/ListenDrops, the setup messages delivered by a retransmission, and the
    connect.syn_retx / synack_retx / setup_retx waits per transaction as a share of the cycle. None without any."""
    c = (summary.get("connection_probe") or {}).get("counters") or {}
    waits = {s["name"]: s for s in summary.get("connection_setup") or [] if s["name"] in RETX_STEPS + SETUP_RETX}
    syn, synack = c.get("syn_retransmits", 0), c.get("synack_retransmits", 0)
    if not (syn or synack or waits):
        return None
    wait = sum(s["us_per_conn"] for s in waits.values())
    cycle = (summary.get("closure") or {}).get("cycle_us")
    out = {"syn": syn, "synack": synack, "setup_messages": sum(p["count"] for p in setup_parts or []),
           "listen_overflows": c.get("listen_overflows", 0), "listen_drops": c.get("listen_drops", 0),
           "connections_waited": sum(s["count"] for n, s in waits.items() if n in RETX_STEPS),
           "wait_us_per_txn": round(wait, 1),
           "wait_share_pct": round(100.0 * wait / cycle, 1) if cycle else None,
           "by_stage": {n: s["us_per_conn"] for n, s in waits.items()}}
    if kernel:
        out["kernel_syn_retrans"] = sum(v.get("TCPSynRetrans", 0) for v in kernel.values())
    return out
