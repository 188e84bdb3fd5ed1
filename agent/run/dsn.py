"""`pathprof run --dsn`: pgbench against a server pathprof does not own (no path built, no server started)."""
from __future__ import annotations

import os
import time

import pathprof
from pathprof.agent.discovery import profiled_path
from pathprof.agent.host.machine import cpu_busy_ns, host_info
from pathprof.agent.postgres import pgbench
from pathprof.agent.postgres.conninfo import redact, split_secret
from pathprof.agent.run.options import Reporter, RunOptions
from pathprof.agent.run.outcome import recording
from pathprof.agent.run.signals import sigterm_as_interrupt
from pathprof.analysis.rundir import RunDir
from pathprof.errors import UserError


def execute_dsn(opts: RunOptions, ui: Reporter) -> RunDir:
    """pgbench against --dsn; with probes, the path to the server is discovered from pathprof's own connection
    (pathprof.agent.discovery.chain) and profiled like a built one, as far as it is on this machine."""
    import psycopg
    opts.workload.validate(os.cpu_count() or 1)
    ui.phase("connecting to --dsn")
    table = path = None
    try:
        with psycopg.connect(opts.dsn, connect_timeout=5, autocommit=True) as conn:
            version = conn.execute("show server_version").fetchone()[0]
            max_conn = int(conn.execute("show max_connections").fetchone()[0])
            reserved = int(conn.execute("show superuser_reserved_connections").fetchone()[0])
            in_use = conn.execute("select count(*) from pg_stat_activity where backend_type = 'client backend'"
                                  ).fetchone()[0]
            if opts.probes != "off":
                ui.phase("discovering the path from pathprof's own connection")
                table, path = _discover(conn.pgconn.socket)
    except psycopg.Error as e:
        msg = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise UserError(f"cannot use --dsn: {msg}") from None
    free = max_conn - reserved - in_use
    if opts.workload.clients > free:
        raise UserError(f"--clients {opts.workload.clients} exceeds what the server allows now "
                        f"({free} free of max_connections={max_conn})")
    probes, capabilities = None, []
    if path is not None:
        for line in profiled_path.summary_lines(table, path):
            ui.note(f"path: {line}")
        if not (path.postmaster or path.hops):
            ui.note("--dsn: no part of the path beyond pgbench is on this machine; the probes see pgbench only")
        probes, capabilities = _probe_session(opts, table, path)
    rd = RunDir.create(opts.runs_dir, "dsn")
    rd.update(pathprof_version=pathprof.__version__, host=host_info(),
              topology={"name": "dsn", "source": "--dsn", "options": {}, "spec": None},
              workload=opts.workload.to_dict(), status="running")
    with recording(rd):
        _record(opts, rd, version, max_conn, (probes, capabilities), (table, path), ui)
    return rd


def _record(opts: RunOptions, rd: RunDir, version: str, max_conn: int, probing: tuple, found: tuple,
            ui: Reporter) -> None:
    """pgbench's command, the server and the path into the run directory, then the measurement. probing:
    (the probe session or None, the doctor's capabilities)."""
    import psycopg
    probes = probing[0]
    table, path = found
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
    if path is not None:
        rd.write_json("topology.json", profiled_path.topology_doc(table, path, f"--dsn {redact(opts.dsn)}"))
    try:
        with sigterm_as_interrupt():
            _measure(opts, rd, argv, probing, (table, path), ui, secret_env)
    finally:
        if probes is not None:
            probes.close()


def _discover(sock_fd: int):
    from pathprof.agent.discovery import chain as discovery
    from pathprof.agent.discovery.sockets import SocketTable
    table = SocketTable.take()
    return table, discovery.from_client_socket(os.fstat(sock_fd).st_ino, table)


def _probe_session(opts: RunOptions, table, path):
    from pathprof.agent.probing import doctor
    from pathprof.agent.probing.session import ProbeSession
    capabilities = doctor.require(opts.probes)
    return ProbeSession(profiled_path.probe_config(table, path, opts.probes, opts.trace_sample,
                                                   opts.probe_window_s, opts.probe_period_s)), capabilities


def _measure(opts: RunOptions, rd: RunDir, argv: list[str], probing: tuple, found: tuple, ui: Reporter,
             secret_env: dict | None = None) -> None:
    from pathprof.agent.probing.windows import window_meta
    from pathprof.agent.run import recorder
    w = opts.workload
    table, path = found
    probes, capabilities = probing
    if probes is not None:
        ui.phase(f"loading probes ({opts.probes})")
        probes.start()
        profiled_path.track(probes, path, clients=False)
    clock: dict = {}
    history: list = []
    live: dict = {}

    def started(pid: int) -> None:
        if probes is not None:
            probes.track(pid, "pgbench")
            probes.reset()
            probes.start_windows(w.duration_s)
        clock.update(cpu0=cpu_busy_ns(), t0=time.monotonic_ns())

    def on_progress(pr) -> None:
        history.append(pr)
        snap = None
        if probes is not None:
            from pathprof.agent.probing.live_breakdown import LiveBreakdown
            live.setdefault("b", LiveBreakdown(probes, clock["t0"]))
            snap = {**probes.snapshot(), **live["b"].refresh(history)}
        ui.progress(pr, snap)

    ui.phase(f"pgbench: {w.clients} clients, {w.duration_s} s")
    log_dir = rd.file("pgbench") / "log"
    result = pgbench.run(None, argv, rd.file("pgbench"), on_progress=on_progress, on_start=started,
                         env=secret_env)
    (busy1, total1), t1 = cpu_busy_ns(), time.monotonic_ns()
    if probes is not None:
        probes.stop_windows()
    ui.phase("reading results")
    presult = probes.stop() if probes is not None else None
    logs = pgbench.log_stats(log_dir, presult.windows if presult is not None else [])   # one streaming pass
    pgbench.finish(result, log_dir, percentiles=logs.percentiles())
    meta_probes: dict = {"level": "off" if probes is None else opts.probes}
    if presult is not None:
        meta_probes.update(recorder.save_probe_result(rd, presult, capabilities))
        meta_probes.update(window_meta(presult.windows, logs, opts.probe_window_s, opts.probe_period_s))
        meta_probes["notes"] = list(meta_probes.get("notes") or []) + [
            f"discovered path: {line}" for line in profiled_path.summary_lines(table, path)]
    (busy0, total0) = clock["cpu0"]
    rd.update(pgbench={**rd.meta["pgbench"], "result": result.to_dict()},
              cpu={"busy_ns": busy1 - busy0, "elapsed_ns": t1 - clock["t0"], "ncpu": os.cpu_count(),
                   "total_ns": total1 - total0}, probes=meta_probes)
