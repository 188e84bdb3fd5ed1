"""The connection-setup view of runs that open a new connection per transaction (pgbench -C, `--connect`).

Read from `connect.parquet` (written by pathprof.agent.probing.conn, one row per step). Steps on the client's
path, back to back, so they add up to `connect.total` (the client's connect() call -> it has read the first
ReadyForQuery) -- `summary["connection_setup"]`, µs per connection:

  connect.tcp_handshake      client SYN_SENT -> client ESTABLISHED (TCP only; absent on unix sockets). A SYN
                             dropped by a full listen queue is retransmitted after 1 s: inside this step, and
                             counted (`connection_probe.counters`: syn_retransmits -- syn_retransmits_sampled
                             of connections sampled --, synack_retransmits, and the server namespace's
                             listen_overflows / listen_drops from TcpExt)
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
                             (no client identity needed), divided by the connections sampled
  connect.unsplit            only when no backend could be paired with its client (a hop such as docker-proxy,
                             or NAT, between them: the hello wakes the hop's socket, or the ports differ): the
                             client's own connect time (connect.client_total: connect start -> its read of the
                             hello) minus the backend's steps above (fork, first_run, backend_init_auth), which
                             are measured without a client: handshakes, accept queues, the hop accepting and
                             dialing upstream, the hello's way back

The summary also puts these steps into the latency view (leg `connect`, µs per transaction = µs per
connection): the per-message stages leave the setup exchange to this probe (probes/msg.bpf.h, conn_split), so
the two tile the client's cycle together (`closure.latency_error_pct`, against clients / TPS). Connections are
sampled inside the same measurement windows as the per-message stages (counter `sampled`).

The sum without connect.thread_wait compares with pgbench's `average connection time` (`connection_time_ms`
in run.json/summaries), which times PQconnectdb *and* PQfinish per transaction (`closure.connection_error_pct`;
pgbench's figure is of the whole run, this probe's of the windows).

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

SETUP_STEPS = ["connect.tcp_handshake", "connect.accept", "connect.fork", "connect.first_run",
               "connect.backend_init_auth", "connect.ready_delivery", "connect.thread_wait"]
BACKEND_STEPS = ("connect.fork", "connect.first_run", "connect.backend_init_auth")   # need no client pairing
CONNECT_LEG = "connect"
NOT_IN_PGBENCH_CONNECTION_TIME = ("connect.thread_wait",)     # the latency view's leg of the setup steps (stages.py)
ASYNC_STEPS = ["connect.first_query", "connect.teardown", "connect.reap"]
CPU_STEPS = ["cpu.client_connect", "cpu.backend_init", "cpu.backend_first_query", "cpu.backend_exit",
             "cpu.backend_total", "cpu.postmaster"]
LOSS_STATS = ("tasks_full", "pending_full", "out_of_order", "accept_lost", "no_peer",
              "recursion_misses")


def _rows(frame: pd.DataFrame | None, names: list[str], connections: int) -> list[dict]:
    if frame is None or not len(frame):
        return []
    by = {r.step: r for r in frame.itertuples(index=False)}
    out = []
    for name in names:
        r = by.get(name)
        if r is None or not r.count:
            continue
        # one sample per connection: the mean over the connections seen; an aggregate: over all connections
        per_total = getattr(r, "per", "conn") == "total"
        denom = connections if per_total else r.count
        if not denom:
            continue
        hist = None if per_total else getattr(r, "hist", None)
        p50, p99 = hist_quantile(hist, 0.5), hist_quantile(hist, 0.99)
        out.append({"name": name, "us_per_conn": round(r.sum_ns / denom / 1e3, 2),
                    "p50_us": None if p50 is None else round(p50 / 1e3, 2),
                    "p99_us": None if p99 is None else round(p99 / 1e3, 2),
                    "count": int(r.count)})
    return out


def _unsplit(frame: pd.DataFrame | None, setup: list[dict]) -> list[dict]:
    """No backend paired with its client (a hop or NAT between them: the hello wakes the hop's socket, or the ports
    differ): the client's own connect.client_total minus the backend's steps becomes `connect.unsplit`, so the
    setup still adds up to what the client waited."""
    names = {s["name"] for s in setup}
    total = _rows(frame, ["connect.client_total"], 0)
    if "connect.ready_delivery" in names or not total:
        return setup
    own = sum(s["us_per_conn"] for s in setup if s["name"] in BACKEND_STEPS)
    row = {**total[0], "name": "connect.unsplit", "us_per_conn": round(max(total[0]["us_per_conn"] - own, 0.0), 2),
           "p50_us": None, "p99_us": None}
    return [row] + setup


def connection_setup_view(frame: pd.DataFrame | None, connections: int) -> list[dict]:
    """Steps on the client's connect path, in timeline order: [{name, us_per_conn, p50_us, p99_us, count}]."""
    return _rows(frame, SETUP_STEPS, connections)


def connection_async_view(frame: pd.DataFrame | None, connections: int) -> list[dict]:
    return _rows(frame, ASYNC_STEPS, connections)


def connection_cpu_view(frame: pd.DataFrame | None, connections: int) -> list[dict]:
    return _rows(frame, CPU_STEPS, connections)


def setup_stages(setup: list[dict]) -> list[dict]:
    """The setup steps as latency-view rows (leg `connect`): one connection per transaction, so µs per connection
    is µs per transaction. The per-message stages leave the setup exchange out (probes/msg.bpf.h, conn_split), so
    together they tile the client's cycle."""
    return [{"name": s["name"], "leg": CONNECT_LEG, "us_per_txn": s["us_per_conn"], "p50_us": s.get("p50_us"),
             "p99_us": s.get("p99_us"), "count_per_txn": 1.0} for s in setup]


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
    # aggregates (connect.thread_wait, cpu.postmaster) are per connection sampled, when the probe sampled inside
    # windows: the backends sampled, or, where no backend starts (a pooler keeping its server connections), the
    # clients' connects sampled. Over all of pgbench's connections a pooler's thread_wait came out as small as the
    # windows' share of the run (pgbouncer -C, 1 client, 2 s windows of a 5 s run: 15 us for 41, closure -9 %)
    per_total = (counters.get("sampled", 0) + counters.get("unpaired_sampled", 0)
                 or _step_count(frame, "connect.client_total") or connections)
    setup = _unsplit(frame, connection_setup_view(frame, per_total))
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
    measured_ms = res.connection_time_ms
    closure["connection_measured_us"] = None if measured_ms is None else measured_ms * 1000.0
    closure["connection_error_pct"] = (round((total - measured_ms * 1000.0) / (measured_ms * 1000.0) * 100, 1)
                                       if measured_ms else None)
