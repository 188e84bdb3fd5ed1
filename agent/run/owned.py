"""One profiled run: build the path, start the owned server and hops, attach probes, drive pgbench, record,
tear down."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pathprof
from pathprof.agent.host import delayline, proc
from pathprof.agent.host.journal import Journal
from pathprof.agent.host.machine import cpu_busy_ns, host_info, require_root  # noqa: F401  (run.require_root: topology_cmd)
from pathprof.agent.postgres import pgbench
from pathprof.agent.postgres.server import ManagedPostgres, prepare_cluster
from pathprof.agent.run.background import Background, in_background
from pathprof.agent.run.options import Reporter, RunOptions
from pathprof.agent.run.outcome import error_text
from pathprof.agent.run.phase_clock import PhaseClock
from pathprof.agent.run.setup import (
    STATE_ROOT,
    abandon,
    claim_run_id,
    import_analysis,
    load_probes,
    require_probes,
    settle,
)
from pathprof.agent.run.signals import checkpoint, interrupted, sigterm_as_interrupt, uninterruptible
from pathprof.agent.run.status import rss_kb
from pathprof.analysis.rundir import RunDir
from pathprof.errors import Interrupted, UserError
from pathprof.topologies import spec as specmod


class _Checked(Reporter):
    """Passes through to the user's reporter, stopping at each phase if a signal was swallowed."""

    def __init__(self, inner: Reporter):
        self.inner = inner

    def phase(self, text: str) -> None:
        if text != "tearing down":
            checkpoint()
        self.inner.phase(text)

    def note(self, text: str) -> None:
        self.inner.note(text)

    def progress(self, pr, snap) -> None:
        self.inner.progress(pr, snap)


def execute(opts: RunOptions, ui: Reporter) -> RunDir:
    clock = PhaseClock()
    require_root()
    proc.which("pgbench")
    ui = _Checked(ui)
    if opts.dsn and opts.links:
        raise UserError("--link impairs a link pathprof builds; a --dsn run has none (use a topology)")
    if opts.dsn:
        from pathprof.agent.run.dsn import execute_dsn
        return execute_dsn(opts, ui)
    topo, services_mod = _preflight(opts)
    journal = Journal(claim_run_id(opts.runs_dir, topo.name))
    state_dir = STATE_ROOT / journal.run_id
    journal.record("dir", path=str(state_dir))
    state_dir.mkdir(parents=True, exist_ok=True)
    cluster = None
    try:
        # The owned cluster: a cached initdb'ed template, copied by a `cp` running while the run goes on.
        cluster = prepare_cluster(state_dir / "pg") if topo.postgres.kind == "local" else None
        capabilities = require_probes(opts)
        rd = RunDir.create(opts.runs_dir, topo.name, run_id=journal.run_id)
        journal.record("note", run_dir=str(rd.path.resolve()))   # `pathprof cleanup` marks it if this run is killed
    except BaseException:
        abandon(cluster, journal)
        raise
    rd.update(pathprof_version=pathprof.__version__, host=host_info(),
              topology={"name": topo.name, "source": topo.source, "options": topo.options, "spec": topo.to_dict()},
              workload=opts.workload.to_dict(), status="running", journal=journal.run_id)
    services: list = []
    pg = None
    probe_loading, loaded = None, {"capabilities": capabilities}
    clock.add("checks", time.monotonic() - clock.t0)
    try:
        with sigterm_as_interrupt():
            ui.phase(f"building topology {topo.name}")
            with clock.phase("namespaces"):
                from pathprof.topologies import builder
                ctx = builder.build(topo, journal, state_dir, progress=lambda s: ui.phase(f"creating {s}"))
            # Only now, after pyroute2's forked helpers (a fork copies the locks another thread holds, such as
            # an import's), ~0.4 s of imports the results need (pandas) on a thread, overlapping the set-up.
            Background(import_analysis)
            if opts.probes != "off":    # loaded (verified) in the background while the server and hops start
                ui.phase(f"loading probes ({opts.probes}) in the background")
                probe_loading = Background(load_probes, opts, topo, loaded)
            ctx.clients = opts.workload.clients
            pg = _start_postgres(opts, topo, ctx, journal, state_dir, ui, clock, cluster)
            with clock.phase("services"):
                for s in topo.services:
                    ui.phase(f"starting {s.kind} ({s.name}) in {s.host}")
                    svc = services_mod.create(s)
                    services.append(svc)
                    svc.start(ctx)
            _measure(opts, topo, ctx, pg, services, (probe_loading, loaded), rd, ui, clock)
    except KeyboardInterrupt:
        rd.update(status="interrupted")
        raise Interrupted("interrupted; the topology was torn down") from None
    except BaseException as e:
        rd.update(status="failed", error=error_text(e))
        raise
    finally:
        with uninterruptible(), clock.phase("teardown"):
            _teardown(pg, (probe_loading, loaded), services, rd, state_dir, cluster, journal, ui)
        try:
            rd.update(setup_s=clock.total())
        except OSError:                 # a full runs directory: the original error matters more
            pass
    rd.update(status="complete")
    return rd


def _preflight(opts: RunOptions):
    """Everything that can refuse the run before anything is made: the topology, what its hops accept of the
    workload, the workload itself, the WAL device and the server's limits. Returns (topology, services module)."""
    proc.which("initdb")
    topo = specmod.load(opts.topology, opts.topo_options, opts.links)
    services_mod = None
    if topo.services:
        from pathprof.topologies import services as services_mod
        for s in topo.services:
            check = getattr(services_mod.create(s), "check_workload", None)
            if check:
                check(opts.workload.mode, opts.workload.connect, opts.workload.clients,
                      opts.workload.threads or min(opts.workload.clients, os.cpu_count() or 1))
    opts.workload.validate(os.cpu_count() or 1)
    if opts.wal_device_mb:
        from pathprof.agent.host.storage import check_size
        check_size(opts.wal_device_mb)
    if opts.wal_device_limit:
        from pathprof.agent.host.io_limit import check_available
        check_available()
    _check_pg_limits(opts)
    return topo, services_mod


def _teardown(pg, loading: tuple, services: list, rd: RunDir, state_dir: Path, cluster, journal: Journal,
              ui) -> None:
    """Undo the run in the order that loses nothing: the server's shutdown checkpoint and the probes' detaching
    overlap stopping the hops; logs are kept before the state directory goes; then the journal is replayed."""
    probe_loading, loaded = loading
    ui.phase("tearing down")
    if pg:
        pg.begin_stop()         # its shutdown checkpoint runs while the probes are closed
    if probe_loading is not None:
        probe_loading.join(quiet=True)  # never close what is still being loaded
    # detaching the probes (tens of ms per link) overlaps stopping the hops and the server
    closing = Background(loaded["session"].close) if loaded.get("session") is not None else None
    for svc in reversed(services):
        try:
            svc.stop()
        except Exception as e:  # keep tearing down
            ui.note(f"stopping {svc.kind}: {e}")
    if pg:
        pg.stop()
    if closing is not None:
        try:
            closing.join()
        except Exception as e:
            ui.note(f"closing the probes: {e}")
    try:
        _keep_logs(rd, state_dir, services)
    except OSError as e:        # a full runs directory must not keep the path from being torn down
        ui.note(f"server and hop logs not kept: {e}")
    settle(cluster)            # a copy still going would recreate files teardown removes
    problems = journal.teardown()
    if problems:
        ui.note("could not remove: " + "; ".join(problems) + " (run `pathprof cleanup`)")


def _keep_logs(rd: RunDir, state_dir: Path, services: list) -> None:
    """Copy server, hop and guest-console logs into the run directory before the state directory goes."""
    import shutil
    logs = rd.file("logs")
    found = [p for p in state_dir.rglob("*.log") if p.is_file()]
    for svc in services:
        try:
            d = svc.describe()
        except Exception:
            continue
        for key in ("console_log", "log", "log_path"):
            if isinstance(d.get(key), str) and Path(d[key]).is_file():
                found.append(Path(d[key]))
    for p in dict.fromkeys(found):
        logs.mkdir(exist_ok=True)
        shutil.copyfile(p, logs / (p.parent.name + "-" + p.name if (logs / p.name).exists() else p.name))


def _check_pg_limits(opts: RunOptions) -> None:
    mc = opts.pg_settings.get("max_connections")
    if mc is not None:
        try:
            mc_i = int(mc)
        except ValueError:
            raise UserError(f"--pg-set max_connections={mc} is not a number") from None
        if opts.workload.clients > mc_i - 3:
            raise UserError(f"--clients {opts.workload.clients} exceeds what the server allows "
                            f"(max_connections={mc_i}, 3 reserved for superusers)")


def _start_postgres(opts, topo, ctx, journal, state_dir, ui, clock: PhaseClock, cluster=None):
    from pathprof.topologies.builder import PostgresEndpoint, port_in_use
    netns = topo.netns_of(topo.postgres.host)
    if topo.postgres.kind == "guest":
        return None  # the qemu-guest service brings its own server
    if topo.postgres.listen != "unix" and port_in_use(netns, topo.postgres.listen, topo.postgres.port):
        raise UserError(f"port {topo.postgres.port} is already in use in host '{topo.postgres.host}'")
    max_conn = max(100, opts.workload.clients + 20)
    settings = dict(opts.pg_settings)
    if "max_connections" in settings:
        max_conn = int(settings.pop("max_connections"))
    pg = ManagedPostgres(state_dir / "pg", netns, topo.postgres.listen, topo.postgres.port, settings, max_conn,
                         journal)
    waldir = None
    if opts.wal_device_mb:
        from pathprof.agent.host.storage import make_wal_device
        ui.phase(f"WAL device: {opts.wal_device_mb} MB loop device")
        wal = make_wal_device(journal, state_dir, opts.wal_device_mb, *pg._uid())
        waldir, pg.wal_device = wal.waldir, wal
    ui.phase("initdb (owned PostgreSQL)")
    with clock.phase("initdb"):
        pg.initdb(waldir, cluster)
    ui.phase(f"starting postgres in {topo.postgres.host}")
    with clock.phase("server_start"):
        pg.start()
    if opts.workload.script == "tpcc":
        from pathprof.agent.postgres import tpcc
        ui.phase(f"loading TPC-C tables: {opts.workload.scale} warehouse(s)")
        with clock.phase("pgbench_init"):
            pg.load_sql(tpcc.load_sql(opts.workload.scale))
    elif opts.workload.needs_tables:
        ui.phase(f"pgbench -i -s {opts.workload.scale}")
        with clock.phase("pgbench_init"):
            pg.init_pgbench(opts.workload.scale)
    if pg.wal_device and opts.wal_device_limit:      # after the load: only the measured run is throttled
        from pathprof.agent.host import io_limit
        pg.wal_device.limit = dict(opts.wal_device_limit)
        ui.phase(f"WAL device limit: {io_limit.describe(pg.wal_device.limit)} on {pg.wal_device.device}")
        pg.wal_device.cgroup = str(io_limit.apply(journal, journal.run_id, pg.wal_device.device, pg.pid,
                                                  pg.wal_device.limit))
    ctx.postgres = PostgresEndpoint(topo.postgres.host, None if topo.postgres.listen == "unix" else
                                    topo.postgres.listen, topo.postgres.port, str(pg.socket_dir))
    return pg


def _target(topo, pg) -> pgbench.Target:
    t = topo.client.targets[topo.client.target]
    if t.unix:
        return pgbench.Target(str(pg.socket_dir), t.port)
    return pgbench.Target(t.host, t.port)


def _measure(opts, topo, ctx, pg, services, loading: tuple, rd: RunDir, ui, phases: PhaseClock) -> None:
    from pathprof.agent.run import recorder
    w = opts.workload
    client_ns = topo.netns_of(topo.client.host)
    log_dir = rd.file("pgbench") / "log"
    log_dir.mkdir(parents=True, exist_ok=True)
    argv = pgbench.build_argv(w, _target(topo, pg), log_dir, rd.file("pgbench"))
    with phases.phase("run_info"):
        rd.update(pgbench={"argv": argv, "version": pgbench.pgbench_version()},
                  postgres=pg.describe() if pg else {"owned": True, "kind": "guest"},
                  services=[s.describe() for s in services])
        clock = {"checkpoints0": recorder.checkpoints(pg)}
    with phases.phase("probe_load"):       # what is left of loading them, and attaching to the path
        probe_loading, loaded = loading
        if probe_loading is not None:
            probe_loading.join()
        probes = loaded.get("session")
        if probes is not None:
            recorder.track_path(probes, pg, services)
        conn_probe = _conn_probe(opts, probes, pg, ui)

    from pathprof.agent.run.pooler_counters import PoolerCounters
    pooler = PoolerCounters(services)

    def started(pid: int) -> None:
        pooler.start()
        if probes is not None:
            probes.track(pid, "pgbench")
            probes.reset()
            probes.start_windows(w.duration_s)
        if conn_probe is not None:
            conn_probe.track_client(pid)
            conn_probe.reset()
        clock["cpu0"], clock["t0"] = cpu_busy_ns(), time.monotonic_ns()
        clock["tcp0"] = recorder.tcp_counters(topo)   # the kernel's retransmission counters, for the check

    ui.phase(f"pgbench: {w.clients} clients, {w.duration_s} s")
    seen_sockets: dict = {}

    history: list = []
    live = {}
    from pathprof.agent.run.status import StatusFile
    status = StatusFile(rd.file("status.json"), probes, opts.status_every_s, w.duration_s)

    def on_progress(pr) -> None:
        status.update(pr)
        if not seen_sockets:  # one look at the live connections, while pgbench holds them open
            seen_sockets.update(recorder.live_sockets(topo))
        history.append(pr)
        snap = None
        if probes is not None:
            from pathprof.agent.probing.live_breakdown import LiveBreakdown
            if "b" not in live:
                live["b"] = LiveBreakdown(probes, clock["t0"])
            snap = {**probes.snapshot(), **live["b"].refresh(history)}
        ui.progress(pr, snap)

    def path_broken() -> list[str]:
        broken = _dead_parts(pg, services, history) + [f"link {x} is down" for x in recorder.down_links(topo)]
        return broken + delayline.dead_delay_lines(ctx.journal)

    try:
        try:
            with phases.phase("pgbench"):
                result = pgbench.run(client_ns, argv, rd.file("pgbench"), on_progress=on_progress,
                                     on_start=started, should_stop=interrupted, path_broken=path_broken)
        except UserError as e:             # pgbench stuck or failed: say what of the path is broken, if anything
            broken = path_broken()
            if broken:
                rd.update(failure=broken)
                raise UserError(f"{e}; the path broke during the run: " + "; ".join(broken)) from None
            raise
        conn_frame = conn_probe.stop() if conn_probe is not None else None
    finally:
        status.close()                  # a status.json write in flight reads the probes' maps
        counters = pooler.stop()
        if conn_probe is not None:
            conn_probe.close()
    (busy1, total1), t1 = cpu_busy_ns(), time.monotonic_ns()
    tcp_kernel = recorder.tcp_counters_during(clock.get("tcp0") or {}, recorder.tcp_counters(topo))
    t_results = time.monotonic()
    if probes is not None:
        probes.stop_windows()        # pgbench is done: no window may outlive it
    (busy0, total0) = clock["cpu0"]
    cpu = {"busy_ns": busy1 - busy0, "elapsed_ns": t1 - clock["t0"], "ncpu": os.cpu_count(),
           "total_ns": total1 - total0}
    ui.phase("reading results")
    presult = probes.stop() if probes is not None else None
    # one streaming pass over the per-transaction logs: percentiles and the windows split, memory flat in the
    # run's length (analysis.windows.LogStats)
    logs = pgbench.log_stats(log_dir, presult.windows if presult is not None else [])
    pgbench.finish(result, log_dir, percentiles=logs.percentiles(), compress=False)
    if pg is not None and pg.wal_device and pg.wal_device.cgroup:
        from pathprof.agent.host.io_limit import serviced
        pg.wal_device.throttled = serviced(pg.wal_device.cgroup, pg.wal_device.device)
        rd.update(postgres={**rd.meta.get("postgres", {}), "wal_device": pg.wal_device.describe()})
    meta_probes = {"level": opts.probes}
    with in_background(pgbench.compress_logs, log_dir):   # gzip the logs while the probes' results are saved
        if presult is not None:
            meta_probes.update(recorder.save_probe_result(rd, presult, loaded.get("capabilities")))
            from pathprof.agent.probing.windows import window_meta
            meta_probes.update(window_meta(presult.windows, logs, opts.probe_window_s, opts.probe_period_s))
    if conn_frame is not None:
        rd.write_frame("connect.parquet", conn_frame)
        meta_probes["conn_cost"] = conn_probe.cost()
        meta_probes["notes"] = list(meta_probes.get("notes") or []) + conn_probe.notes
    rd.update(pgbench={**rd.meta["pgbench"], "result": result.to_dict()}, cpu=cpu, probes=meta_probes,
              postgres={**rd.meta.get("postgres", {}),
                        "checkpoints": recorder.checkpoints_during(clock["checkpoints0"], recorder.checkpoints(pg))})
    if counters:
        rd.update(pooler_counters=counters)
    if tcp_kernel:
        rd.update(tcp_counters=tcp_kernel)
    rd.write_json("topology.json", recorder.discovered_path(topo, ctx, pg, services, seen_sockets))
    phases.add("results", time.monotonic() - t_results)
    peak_kb = rss_kb()[1]                     # VmHWM over the whole run, results phase included
    rd.update(agent_peak_rss_mb=round(peak_kb / 1024, 1) if peak_kb else None)
    dead = _dead_parts(pg, services, history)
    if dead:
        rd.update(failure=dead)
        raise UserError("the path broke during the run: " + "; ".join(dead) + f". Everything recorded until then "
                        f"is in {rd.path} (status failed); `pathprof report {rd.path}` shows it")


def _dead_parts(pg, services, history: list) -> list[str]:
    """The parts of the path that are gone after pgbench ended (the server, a hop), with when throughput
    stopped: a run whose path broke must not read as a good one."""
    gone = []
    if pg is not None and pg.process is not None and pg.process.poll() is not None:
        gone.append(f"the PostgreSQL server (postmaster pid {pg.process.pid}) exited with code {pg.process.returncode}")
    for svc in services:
        p = getattr(svc, "popen", None)
        if p is not None and p.poll() is not None:
            gone.append(f"{svc.kind} ({getattr(svc, 'hop', '?')}, pid {p.pid}) exited with code {p.returncode}")
    if gone:
        stalled = next((pr.elapsed_s for i, pr in enumerate(history)
                        if pr.tps == 0 and any(h.tps > 0 for h in history[:i])), None)
        if stalled is not None:
            gone.append(f"throughput stopped about {stalled:.0f} s into pgbench")
    return gone


def _conn_probe(opts, probes, pg, ui):
    """--connect: the connection-setup probe (probes/conn.bpf.c) next to the main ones; failing to load it
    costs the split, not the run."""
    if not opts.workload.connect or probes is None or pg is None or not pg.pid:
        return None
    from pathprof.agent.probing.conn import ConnProbe
    w = opts.workload
    cp = ConnProbe(pg.pid, probes.config.service_ports, clients_per_thread=-(-w.clients // max(w.threads or 1, 1)))
    try:
        cp.start()
    except UserError as e:
        ui.note(f"connection-setup probe not loaded: {e}")
        return None
    probes.window_listeners.append(cp.set_window)   # sample the connections of the stages' windows only
    return cp
