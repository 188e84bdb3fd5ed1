"""The built path source of the measurement pipeline (agent.run.pipeline): `run` on a topology. Everything that
can refuse the run before anything is made (`preflight`), the run's id, journal and state directory (`claim`), the
path itself — namespaces and links, the owned PostgreSQL server, the hops (`build`, `start_postgres`) — what of it
broke during the run (`dead_parts`) and its teardown in the order that loses nothing (`BuiltPath.teardown`).
Moved from owned.py (#23) unchanged."""
from __future__ import annotations

import os
from pathlib import Path

from pathprof.agent.host import proc
from pathprof.agent.host.journal import Journal
from pathprof.agent.postgres.server import ManagedPostgres, prepare_cluster
from pathprof.agent.run.background import Background
from pathprof.agent.run.options import RunOptions
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
from pathprof.agent.run.signals import uninterruptible
from pathprof.analysis.rundir import RunDir
from pathprof.errors import UserError
from pathprof.topologies import spec as specmod


class BuiltPath:
    """The built path source: what this run makes and owns (journal, state directory, the cluster's copy, the
    server, the hops, the probes loading in the background), filled in as it is made and undone by `teardown`."""

    def __init__(self, journal: Journal, state_dir: Path, cluster, capabilities):
        self.journal, self.state_dir, self.cluster = journal, state_dir, cluster
        self.ctx, self.pg, self.services = None, None, []
        self.probe_loading, self.loaded = None, {"capabilities": capabilities}

    def teardown(self, rd: RunDir, ui, clock: PhaseClock) -> None:
        with uninterruptible(), clock.phase("teardown"):
            teardown_path(self.pg, (self.probe_loading, self.loaded), self.services, rd, self.state_dir,
                          self.cluster, self.journal, ui)
        try:
            rd.update(setup_s=clock.total())
        except OSError:                 # a full runs directory: the original error matters more
            pass


def claim(opts: RunOptions, topo) -> tuple[BuiltPath, RunDir]:
    """The run's id, journal, state directory, the cluster's copy (a cached initdb'ed template, copied by a `cp`
    running while the run goes on) and run directory; everything made is undone if one of them fails."""
    journal = Journal(claim_run_id(opts.runs_dir, topo.name))
    state_dir = STATE_ROOT / journal.run_id
    journal.record("dir", path=str(state_dir))
    state_dir.mkdir(parents=True, exist_ok=True)
    cluster = None
    try:
        cluster = prepare_cluster(state_dir / "pg") if topo.postgres.kind == "local" else None
        capabilities = require_probes(opts)
        rd = RunDir.create(opts.runs_dir, topo.name, run_id=journal.run_id)
        journal.record("note", run_dir=str(rd.path.resolve()))   # `pathprof cleanup` marks it if this run is killed
    except BaseException:
        abandon(cluster, journal)
        raise
    return BuiltPath(journal, state_dir, cluster, capabilities), rd


def build(opts: RunOptions, topo, services_mod, built: BuiltPath, ui, clock: PhaseClock) -> None:
    """The path: namespaces and links, the server, the hops; the probes loading meanwhile."""
    ui.phase(f"building topology {topo.name}")
    with clock.phase("namespaces"):
        from pathprof.topologies import builder
        built.ctx = ctx = builder.build(topo, built.journal, built.state_dir,
                                        progress=lambda s: ui.phase(f"creating {s}"))
    # Only now, after pyroute2's forked helpers (a fork copies the locks another thread holds, such as
    # an import's), ~0.4 s of imports the results need (pandas) on a thread, overlapping the set-up.
    Background(import_analysis)
    if opts.probes != "off":    # loaded (verified) in the background while the server and hops start
        ui.phase(f"loading probes ({opts.probes}) in the background")
        built.probe_loading = Background(load_probes, opts, topo, built.loaded)
    ctx.clients = opts.workload.clients
    built.pg = start_postgres(opts, topo, ctx, built.journal, built.state_dir, ui, clock, built.cluster)
    with clock.phase("services"):
        for s in topo.services:
            ui.phase(f"starting {s.kind} ({s.name}) in {s.host}")
            svc = services_mod.create(s)
            built.services.append(svc)
            svc.start(ctx)
    if "hop" in opts.cpu_quota:                         # the hops started after the load: the run alone is capped
        from pathprof.agent.host import cpu_quota
        q = opts.cpu_quota["hop"]
        pids = [p for svc in built.services for p in svc.pids()]
        if not pids:
            names = ", ".join(s.name for s in topo.services)
            raise UserError(f"--cpu-quota hop=: no process of the path's hops ({names}) is running")
        ui.phase(f"CPU quota for the hops: {q.describe()}")
        cpu_quota.apply(built.journal, built.journal.run_id, "hop", pids, q)


def preflight(opts: RunOptions):
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
    if "hop" in opts.cpu_quota and not topo.services:
        raise UserError(f"--cpu-quota hop=: topology {topo.name} has no hop (a pooler or a proxy) to cap; the paths "
                        "with one: pgbouncer, pgpool, docker-dnat, kvm-tap and their -3host forms")
    opts.workload.validate(os.cpu_count() or 1)
    if opts.wal_device_mb:
        from pathprof.agent.host.storage import check_size
        check_size(opts.wal_device_mb)
    if opts.wal_device_limit:
        from pathprof.agent.host.io_limit import check_available
        check_available()
    check_pg_limits(opts)
    return topo, services_mod


def teardown_path(pg, loading: tuple, services: list, rd: RunDir, state_dir: Path, cluster, journal: Journal,
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
        keep_logs(rd, state_dir, services)
    except OSError as e:        # a full runs directory must not keep the path from being torn down
        ui.note(f"server and hop logs not kept: {e}")
    settle(cluster)            # a copy still going would recreate files teardown removes
    problems = journal.teardown()
    if problems:
        ui.note("could not remove: " + "; ".join(problems) + " (run `pathprof cleanup`)")


def keep_logs(rd: RunDir, state_dir: Path, services: list) -> None:
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


def check_pg_limits(opts: RunOptions) -> None:
    mc = opts.pg_settings.get("max_connections")
    if mc is not None:
        try:
            mc_i = int(mc)
        except ValueError:
            raise UserError(f"--pg-set max_connections={mc} is not a number") from None
        if opts.workload.clients > mc_i - 3:
            raise UserError(f"--clients {opts.workload.clients} exceeds what the server allows "
                            f"(max_connections={mc_i}, 3 reserved for superusers)")


def start_postgres(opts, topo, ctx, journal, state_dir, ui, clock: PhaseClock, cluster=None):
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
    if "server" in opts.cpu_quota and pg.pid:           # after the load too: only the measured run is capped
        from pathprof.agent.host import cpu_quota
        q = opts.cpu_quota["server"]
        ui.phase(f"CPU quota for the server: {q.describe()}")
        cpu_quota.apply(journal, journal.run_id, "server", pg.pid, q)
    ctx.postgres = PostgresEndpoint(topo.postgres.host, None if topo.postgres.listen == "unix" else
                                    topo.postgres.listen, topo.postgres.port, str(pg.socket_dir))
    return pg


def dead_parts(pg, services, history: list) -> list[str]:
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
