"""`pathprof run --dsn`: pgbench against a server pathprof does not own (no path built, no server started)."""
from __future__ import annotations

import os
import time

import pathprof
from pathprof.analysis.rundir import RunDir

from . import pgbench
from .errors import Interrupted, UserError
from .host import cpu_busy_ns, host_info
from .run_options import Reporter, RunOptions
from .signals import sigterm_as_interrupt


def execute_dsn(opts: RunOptions, ui: Reporter) -> RunDir:
    import psycopg
    opts.workload.validate(os.cpu_count() or 1)
    ui.phase("connecting to --dsn")
    try:
        with psycopg.connect(opts.dsn, connect_timeout=5, autocommit=True) as conn:
            version = conn.execute("show server_version").fetchone()[0]
            max_conn = int(conn.execute("show max_connections").fetchone()[0])
            reserved = int(conn.execute("show superuser_reserved_connections").fetchone()[0])
            in_use = conn.execute("select count(*) from pg_stat_activity where backend_type = 'client backend'"
                                  ).fetchone()[0]
    except psycopg.Error as e:
        msg = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise UserError(f"cannot use --dsn: {msg}") from None
    free = max_conn - reserved - in_use
    if opts.workload.clients > free:
        raise UserError(f"--clients {opts.workload.clients} exceeds what the server allows now "
                        f"({free} free of max_connections={max_conn})")
    if opts.probes != "off":
        ui.note("--dsn: probes need pathprof's own server and path; this run records pgbench's figures only")
    rd = RunDir.create(opts.runs_dir, "dsn")
    rd.update(pathprof_version=pathprof.__version__, host=host_info(),
              topology={"name": "dsn", "source": "--dsn", "options": {}, "spec": None},
              workload=opts.workload.to_dict(), status="running")
    log_dir = rd.file("pgbench") / "log"
    log_dir.mkdir(parents=True)
    conninfo = psycopg.conninfo.conninfo_to_dict(opts.dsn)
    target = pgbench.Target(str(conninfo.get("host", "")), int(conninfo.get("port", 5432) or 5432),
                            str(conninfo.get("user", "postgres")), opts.dsn)
    argv = pgbench.build_argv(opts.workload, target, log_dir, rd.file("pgbench"))
    # The DSN carries host/port/user itself: pass it as the dbname (pgbench expands conninfo strings).
    argv = [a for a in argv[:argv.index("-h")]] + [opts.dsn]
    rd.update(pgbench={"argv": argv, "version": pgbench.pgbench_version()},
              postgres={"owned": False, "version": version, "settings": {"max_connections": str(max_conn)}})
    clock = {}
    with sigterm_as_interrupt():
        try:
            result = pgbench.run(None, argv, rd.file("pgbench"),
                                 on_progress=lambda pr: ui.progress(pr, None),
                                 on_start=lambda pid: clock.update(cpu0=cpu_busy_ns(), t0=time.monotonic_ns()))
        except KeyboardInterrupt:
            rd.update(status="interrupted")
            raise Interrupted("interrupted") from None
    (busy1, _), t1 = cpu_busy_ns(), time.monotonic_ns()
    pgbench.finish(result, log_dir)
    rd.update(pgbench={**rd.meta["pgbench"], "result": result.to_dict()},
              cpu={"busy_ns": busy1 - clock["cpu0"][0], "elapsed_ns": t1 - clock["t0"],
                   "ncpu": os.cpu_count()}, probes={"level": "off"}, status="complete")
    return rd
