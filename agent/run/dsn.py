"""`pathprof run --dsn`: pgbench against a server pathprof does not own (no path built, no server started)."""
from __future__ import annotations

import os

from pathprof.agent.postgres import pgbench
from pathprof.agent.postgres.conninfo import redact, split_secret
from pathprof.agent.run import start_at
from pathprof.agent.run.options import Reporter, RunOptions
from pathprof.agent.run.outcome import recording
from pathprof.agent.run.pipeline import (
    DiscoveredSource,
    LiveFeed,
    Measurement,
    drive_pgbench,
    pgbench_logs,
    pgbench_results,
    record_head,
)
from pathprof.agent.run.signals import sigterm_as_interrupt
from pathprof.analysis.rundir import RunDir
from pathprof.errors import UserError


def execute_dsn(opts: RunOptions, ui: Reporter) -> RunDir:
    """pgbench against --dsn; with probes, the path to the server is discovered from pathprof's own connection
    (pathprof.agent.discovery.chain) and profiled like a built one, as far as it is on this machine."""
    import psycopg
    from pathprof.agent.host.netns import in_netns
    opts.workload.validate(os.cpu_count() or 1)
    _check_netns(opts.netns)
    start_at.check(opts.start_at)
    ui.phase("connecting to --dsn" + (f" from --netns {opts.netns}" if opts.netns else ""))
    table = path = None
    try:
        conn = in_netns(opts.netns, lambda: psycopg.connect(opts.dsn, connect_timeout=5, autocommit=True), 30)
        with conn:
            version = conn.execute("show server_version").fetchone()[0]
            max_conn = int(conn.execute("show max_connections").fetchone()[0])
            reserved = int(conn.execute("show superuser_reserved_connections").fetchone()[0])
            in_use = conn.execute("select count(*) from pg_stat_activity where backend_type = 'client backend'"
                                  ).fetchone()[0]
            if opts.probes != "off":
                ui.phase("discovering the path from pathprof's own connection")
                table, path = _discover(conn.pgconn.socket, opts.netns)
    except psycopg.Error as e:
        msg = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise UserError(f"cannot use --dsn: {msg}") from None
    free = max_conn - reserved - in_use
    if opts.workload.clients > free:
        raise UserError(f"--clients {opts.workload.clients} exceeds what the server allows now "
                        f"({free} free of max_connections={max_conn})")
    probes, capabilities = None, []
    source = DiscoveredSource(table, path) if path is not None else None
    if source is not None:
        source.announce(ui)
        if not (path.postmaster or path.hops):
            ui.note("--dsn: no part of the path beyond pgbench is on this machine; the probes see pgbench only")
        probes, capabilities = _probe_session(opts, source)
    rd = RunDir.create(opts.runs_dir, "dsn")
    extra = {"scope": _scope(table, opts)} if table is not None else {}
    record_head(rd, {"name": "dsn", "source": "--dsn" + (f" --netns {opts.netns}" if opts.netns else ""),
                     "options": {}, "spec": None}, opts.workload.to_dict(), status="running", **extra)
    with recording(rd):
        _record(opts, rd, version, max_conn, (probes, capabilities), source, ui)
    return rd


def _record(opts: RunOptions, rd: RunDir, version: str, max_conn: int, probing: tuple,
            source: DiscoveredSource | None, ui: Reporter) -> None:
    """pgbench's command, the server and the path into the run directory, then the measurement. probing:
    (the probe session or None, the doctor's capabilities)."""
    import psycopg
    probes = probing[0]
    path = source.path if source is not None else None
    log_dir = rd.file("pgbench") / "log"
    log_dir.mkdir(parents=True)
    conninfo = psycopg.conninfo.conninfo_to_dict(opts.dsn)
    public, secret_env = split_secret(opts.dsn)    # the password reaches pgbench through its environment only
    target = pgbench.Target(str(conninfo.get("host", "")), int(conninfo.get("port", 5432) or 5432),
                            str(conninfo.get("user", "postgres")), public)
    argv = pgbench.build_argv(opts.workload, target, log_dir, rd.file("pgbench"))
    # The DSN carries host/port/user itself: pass it as the dbname (pgbench expands conninfo strings).
    argv = [a for a in argv[:argv.index("-h")]] + [public]
    rd.update(pgbench={"argv": argv, "version": pgbench.pgbench_version()},
              postgres={"owned": False, "version": version, "settings": {"max_connections": str(max_conn)},
                        "pid": path.postmaster if path else None})
    if source is not None:
        source.write_topology(rd, f"--dsn {redact(opts.dsn)}")
    try:
        with sigterm_as_interrupt():
            _measure(opts, rd, argv, probing, source, ui, secret_env)
    finally:
        if probes is not None:
            probes.close()


def _check_netns(netns: str | None) -> None:
    from pathprof.agent.host.netns import ns_path
    if netns and not os.path.exists(ns_path(netns)):
        raise UserError(f"--netns {netns}: no such network namespace ({ns_path(netns)} does not exist)")


def _discover(sock_fd: int, netns: str | None = None):
    """The path behind pathprof's own connection. From --netns (this namespace stands for the client's
    machine): the namespace alone, pgbench's side only; the server is on another "machine" whose own agent
    records it (pathprof merge joins them)."""
    from pathprof.agent.discovery import chain as discovery
    from pathprof.agent.discovery.sockets import SocketTable
    table = SocketTable.take()
    if netns is None:
        return table, discovery.from_client_socket(os.fstat(sock_fd).st_ino, table)
    import socket

    from pathprof.agent.host.netns import ns_path
    with socket.socket(fileno=os.dup(sock_fd)) as s:
        peer = s.getpeername()
    path = discovery.DiscoveredPath(namespaces=[os.stat(ns_path(netns)).st_ino], ports={int(peer[1])})
    where = f"[{peer[0]}]:{peer[1]}" if ":" in str(peer[0]) else f"{peer[0]}:{peer[1]}"
    path.unseen.append(f"--netns {netns}: the server at {where} is on another machine: its side is that "
                       "machine's run (pathprof merge joins them)")
    return table, path


def _scope(table, opts: RunOptions) -> dict:
    """run.json `scope` (which host this is); its leaving connections are pgbench's, taken once it connected."""
    from pathprof.agent.discovery import edge
    return {**edge.scope_doc(table, opts.netns, opts.host_name), "leaving_connections": []}


class EdgeWatch:
    """pgbench's connections that leave this host, looked at on its first progress report (it has connected by
    then): run.json scope.leaving_connections, what `pathprof merge` matches hosts by."""

    def __init__(self, netns: str | None):
        self.netns, self.pid, self.conns, self.error = netns, None, None, None

    def started(self, pid: int) -> None:
        self.pid = pid

    def look(self) -> None:
        if self.conns is not None or self.pid is None:
            return
        from pathprof.agent.discovery import edge
        from pathprof.agent.discovery.sockets import SocketTable
        try:
            t = SocketTable.take(self.netns)
            self.conns = edge.leaving(t, t.descendants(self.pid))
        except Exception as e:        # a note in the run, never the run's failure
            self.conns, self.error = [], f"{type(e).__name__}: {e}"


def _probe_session(opts: RunOptions, source: DiscoveredSource):
    from pathprof.agent.probing import doctor
    capabilities = doctor.require(opts.probes)
    return source.session(opts.probes, opts.trace_sample, opts.probe_window_s, opts.probe_period_s), capabilities


def _measure(opts: RunOptions, rd: RunDir, argv: list[str], probing: tuple, source: DiscoveredSource | None,
             ui: Reporter, secret_env: dict | None = None) -> None:
    """The pipeline with a discovered path as the source and pgbench as the load driver."""
    w = opts.workload
    probes, capabilities = probing
    if probes is not None:
        source.attach_probes(probes, ui, opts.probes, clients=False)   # pgbench is the client to follow
    m = Measurement(probes, ui, w.duration_s)
    feed = LiveFeed.keeping_status(rd, probes, ui, opts.status_every_s, w.duration_s, t0=lambda: m.t0)
    watch = EdgeWatch(opts.netns)

    def started(pid: int) -> None:
        watch.started(pid)
        m.open(pid)

    def progress(pr) -> None:
        watch.look()
        feed(pr)

    if opts.netns:
        ui.note(f"pgbench runs in --netns {opts.netns}")
    if probes is not None and opts.start_at is not None:
        probes.prepare_window()          # the window then opens at the moment, not after attaching
    late = start_at.late_note(start_at.wait(opts.start_at, ui))   # the probes attached, pgbench not started
    log_dir = rd.file("pgbench") / "log"
    try:
        result = drive_pgbench(opts.netns, argv, rd, w, ui, feed, started, env=secret_env, on_progress=progress)
    finally:
        feed.close()                    # a status.json write in flight reads the probes' maps
    if "scope" in rd.meta:
        rd.update(scope={**rd.meta["scope"], "leaving_connections": watch.conns or []})
    cpu = m.cpu()
    presult = m.read()
    logs = pgbench_logs(result, log_dir, presult, connect=bool(opts.workload.connect))
    meta_probes: dict = {"level": "off" if probes is None else opts.probes}
    pgbench_results(rd, log_dir, presult, logs, meta_probes, capabilities, (opts.probe_window_s, opts.probe_period_s))
    if presult is not None:
        meta_probes["notes"] = list(meta_probes.get("notes") or []) + source.notes() + ([late] if late else [])
        if watch.conns is None or watch.error:
            meta_probes["notes"].append("pgbench's connections leaving this host could not be listed ("
                                        + (watch.error or "no progress report came") + "): merge cannot match "
                                        "them to another host's run")
    rd.update(pgbench={**rd.meta["pgbench"], "result": result.to_dict()}, cpu=cpu, probes=meta_probes)
