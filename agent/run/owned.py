"""One profiled run: build the path, start the owned server and hops, attach probes, drive pgbench, record,
tear down. The built path source is agent/run/built.py; the shared pipeline (interval, live snapshot, results,
outcome) agent/run/pipeline.py."""
from __future__ import annotations

import time

from pathprof.agent.host import cpu_speed, delayline, proc
from pathprof.agent.host.machine import require_root  # noqa: F401  (run.require_root: topology_cmd)
from pathprof.agent.postgres import pgbench
from pathprof.agent.probing import hooks
from pathprof.agent.run.built import build, claim, dead_parts, preflight
from pathprof.agent.run.options import Reporter, RunOptions, lossy_schedule
from pathprof.agent.run.outcome import recording
from pathprof.agent.run.phase_clock import PhaseClock
from pathprof.agent.run.pipeline import (
    LiveFeed,
    Measurement,
    drive_pgbench,
    pgbench_logs,
    pgbench_results,
    record_head,
)
from pathprof.agent.run.setup import STATE_ROOT  # noqa: F401  (owned.STATE_ROOT: topology_cmd)
from pathprof.agent.run.signals import checkpoint, interrupted, sigterm_as_interrupt
from pathprof.agent.run.status import rss_kb
from pathprof.analysis.rundir import RunDir
from pathprof.errors import UserError


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
    """The pipeline with a built path as the source and pgbench as the load driver (`run --dsn`: dsn.py)."""
    clock = PhaseClock()
    require_root()
    proc.which("pgbench")
    ui = _Checked(ui)
    if opts.dsn and opts.links:
        raise UserError("--link impairs a link pathprof builds; a --dsn run has none (use a topology)")
    if opts.dsn:
        from pathprof.agent.run.dsn import execute_dsn
        return execute_dsn(opts, ui)
    topo, services_mod = preflight(opts)
    opts, note = lossy_schedule(opts, topo)
    if note:
        ui.note(note)
    built, rd = claim(opts, topo)
    record_head(rd, {"name": topo.name, "source": topo.source, "options": topo.options, "spec": topo.to_dict()},
                opts.workload.to_dict(), status="running", journal=built.journal.run_id)
    clock.add("checks", time.monotonic() - clock.t0)
    with recording(rd, "interrupted; the topology was torn down", cleanup=lambda: built.teardown(rd, ui, clock)):
        with sigterm_as_interrupt():
            build(opts, topo, services_mod, built, ui, clock)
            _measure(opts, topo, built.ctx, built.pg, built.services, (built.probe_loading, built.loaded), rd, ui,
                     clock)
    return rd


def _target(topo, pg) -> pgbench.Target:
    t = topo.client.targets[topo.client.target]
    if t.unix:
        return pgbench.Target(str(pg.socket_dir), t.port)
    return pgbench.Target(t.host, t.port)


def _measure(opts, topo, ctx, pg, services, loading: tuple, rd: RunDir, ui, phases: PhaseClock) -> None:
    """pgbench as the load driver on the built path: its command and the path's description recorded, the
    probes attached, the run driven and its results recorded."""
    from pathprof.agent.run import recorder
    log_dir = rd.file("pgbench") / "log"
    log_dir.mkdir(parents=True, exist_ok=True)
    argv = pgbench.build_argv(opts.workload, _target(topo, pg), log_dir, rd.file("pgbench"))
    with phases.phase("run_info"):
        rd.update(pgbench={"argv": argv, "version": pgbench.pgbench_version()},
                  postgres=pg.describe() if pg else {"owned": True, "kind": "guest"},
                  services=[s.describe() for s in services])
        checkpoints0 = recorder.checkpoints(pg)
    with phases.phase("probe_load"):       # what is left of loading them, and attaching to the path
        probe_loading, loaded = loading
        if probe_loading is not None:
            probe_loading.join()
        probes = loaded.get("session")
        if probes is not None:
            recorder.track_path(probes, pg, services)
        conn_probe = _conn_probe(opts, probes, pg, ui)
    m = Measurement(probes, ui, opts.workload.duration_s)
    watch = cpu_speed.SpeedWatch().start()   # the machine's speed through the load (two runs compared: its drift)
    try:
        driven = _drive(opts, topo, ctx, pg, services, argv, m, conn_probe, rd, ui, phases)
    finally:
        speed = watch.stop()
    driven["speed_during"] = speed
    _results(opts, topo, ctx, pg, services, m, driven, (checkpoints0, loaded.get("capabilities")), rd, phases)


def _drive(opts, topo, ctx, pg, services, argv, m: Measurement, conn_probe, rd: RunDir, ui,
           phases: PhaseClock) -> dict:
    """pgbench through the built path, the measured interval opening at its start; what the results need."""
    from pathprof.agent.run import recorder
    from pathprof.agent.run.pooler_counters import PoolerCounters
    w = opts.workload
    pooler = PoolerCounters(services)
    tcp0: dict = {}
    lines0: dict = {}
    quotas: dict = {}

    def started(pid: int) -> None:
        from pathprof.agent.host import cpu_quota
        if "client" in opts.cpu_quota:
            cpu_quota.apply(ctx.journal, ctx.journal.run_id, "client", pid, opts.cpu_quota["client"])
        quotas["watch"] = cpu_quota.QuotaWatch(cpu_quota.pids_by_role(pg, services, pid))
        quotas["t0"] = time.monotonic()
        pooler.start()
        if conn_probe is not None:
            _sample_from_the_start(conn_probe, m.probes)
        m.open_probes(pid, ready=pgbench.setup_done(rd.file("pgbench") / "log"))
        if conn_probe is not None:
            conn_probe.track_client(pid)
            conn_probe.reset()
        m.start_clock()
        tcp0.update(recorder.tcp_counters(topo))   # the kernel's retransmission counters, for the check
        lines0.update(delayline.usage(ctx.journal))  # the delay lines' CPU and packets (the machine's costs)

    seen_sockets: dict = {}
    feed = LiveFeed.keeping_status(rd, m.probes, ui, opts.status_every_s, w.duration_s, t0=lambda: m.t0)

    def on_progress(pr) -> None:
        if not seen_sockets:  # one look at the live connections, while pgbench holds them open
            seen_sockets.update(recorder.live_sockets(topo))
        feed(pr)

    def path_broken() -> list[str]:
        broken = dead_parts(pg, services, feed.history) + [f"link {x} is down" for x in recorder.down_links(topo)]
        return broken + delayline.dead_delay_lines(ctx.journal)

    try:
        try:
            with phases.phase("pgbench"):
                result = drive_pgbench(topo.netns_of(topo.client.host), argv, rd, w, ui, feed, started,
                                       on_progress=on_progress, should_stop=interrupted, path_broken=path_broken)
        except UserError as e:             # pgbench stuck or failed: say what of the path is broken, if anything
            broken = path_broken()
            if broken:
                rd.update(failure=broken)
                raise UserError(f"{e}; the path broke during the run: " + "; ".join(broken)) from None
            raise
        conn_frame = conn_probe.stop() if conn_probe is not None else None
    finally:
        feed.close()                    # a status.json write in flight reads the probes' maps
        counters = pooler.stop()
        if quotas:
            quotas["rows"] = quotas["watch"].stop(time.monotonic() - quotas["t0"])
        if conn_probe is not None:
            conn_probe.close()
    return {"result": result, "conn": (conn_probe, conn_frame), "pooler_counters": counters, "tcp0": tcp0,
            "cpu_quotas": quotas.get("rows"),
            "lines0": lines0, "sockets": seen_sockets, "history": feed.history}


def _results(opts, topo, ctx, pg, services, m: Measurement, driven: dict, before: tuple, rd: RunDir,
             phases: PhaseClock) -> None:
    """The measured interval closed and read; pgbench's logs, the probes' tables, the -C probe, the pooler,
    the checkpoints and the path as seen into the run directory; a path that broke fails the run."""
    from pathprof.agent.run import recorder
    checkpoints0, capabilities = before
    cpu = m.cpu()
    tcp_kernel = recorder.tcp_counters_during(driven["tcp0"], recorder.tcp_counters(topo))
    lines = delayline.usage_during(driven["lines0"], delayline.usage(ctx.journal))
    t_results = time.monotonic()
    presult = m.read()
    if driven["speed_during"]:
        rd.update(host={**rd.meta.get("host", {}), "cpu_speed": {"during": driven["speed_during"]}})
    log_dir = rd.file("pgbench") / "log"
    result = driven["result"]
    logs = pgbench_logs(result, log_dir, presult, connect=bool(opts.workload.connect))
    if pg is not None and pg.wal_device and pg.wal_device.cgroup:
        from pathprof.agent.host.io_limit import serviced
        pg.wal_device.throttled = serviced(pg.wal_device.cgroup, pg.wal_device.device)
        rd.update(postgres={**rd.meta.get("postgres", {}), "wal_device": pg.wal_device.describe()})
    meta_probes = pgbench_results(rd, log_dir, presult, logs, {"level": opts.probes}, capabilities,
                                  (opts.probe_window_s, opts.probe_period_s))
    conn_probe, conn_frame = driven["conn"]
    if conn_frame is not None:
        rd.write_frame("connect.parquet", conn_frame)
        meta_probes["conn_cost"] = conn_probe.cost()
        meta_probes["notes"] = list(meta_probes.get("notes") or []) + conn_probe.notes
        if meta_probes.get("hooks"):       # the connection probe's own ways (conn.bpf.o)
            meta_probes["hooks"]["connect"] = hooks.hooks_record(conn_probe.hook_choices, "conn.bpf.o")["events"]
    if opts.schedule_note and opts.probes != "off":
        meta_probes["notes"] = list(meta_probes.get("notes") or []) + [opts.schedule_note]
    rd.update(pgbench={**rd.meta["pgbench"], "result": result.to_dict()}, cpu=cpu, probes=meta_probes,
              postgres={**rd.meta.get("postgres", {}),
                        "checkpoints": recorder.checkpoints_during(checkpoints0, recorder.checkpoints(pg))})
    if driven["pooler_counters"]:
        rd.update(pooler_counters=driven["pooler_counters"])
    if driven.get("cpu_quotas"):
        rd.update(cpu_quotas=driven["cpu_quotas"])
    if tcp_kernel:
        rd.update(tcp_counters=tcp_kernel)
    if lines:
        rd.update(delay_lines=lines)
    rd.write_json("topology.json", recorder.discovered_path(topo, ctx, pg, services, driven["sockets"]))
    phases.add("results", time.monotonic() - t_results)
    peak_kb = rss_kb()[1]                     # VmHWM over the whole run, results phase included
    rd.update(agent_peak_rss_mb=round(peak_kb / 1024, 1) if peak_kb else None)
    dead = dead_parts(pg, services, driven["history"])
    if dead:
        rd.update(failure=dead)
        raise UserError("the path broke during the run: " + "; ".join(dead) + f". Everything recorded until then "
                        f"is in {rd.path} (status failed); `pathprof report {rd.path}` shows it")


def _sample_from_the_start(conn_probe, probes) -> None:
    """Always on: pgbench's first connections start before the window is open (its programs attach after pgbench's
    start), yet their transactions end inside it and their time is in the cycle. A first connection that waited
    for a SYN retransmission (a second) and was not sampled made the setup steps short by it (a 4-client lossy run:
    -11.7 %): the always-on window is counted from pgbench's start instead. With windows, every connection's setup
    steps are charged with their parts inside them (probes/conn_win.bpf.h), as the cycle is."""
    from pathprof.agent.probing.windows import always_on
    if always_on(probes.config.window_s, probes.config.period_s):
        conn_probe.set_window(time.monotonic_ns())


def _conn_probe(opts, probes, pg, ui):
    """--connect: the connection-setup probe (probes/conn.bpf.c) next to the main ones; failing to load it
    costs the split, not the run."""
    if not opts.workload.connect or probes is None or pg is None or not pg.pid:
        return None
    from pathprof.agent.probing.conn import ConnProbe
    w = opts.workload
    hops = [p for p in probes.config.service_ports if p and int(p) != int(pg.port)]   # a pooler's, a proxy's
    cp = ConnProbe(pg.pid, probes.config.service_ports, clients_per_thread=-(-w.clients // max(w.threads or 1, 1)),
                   hop_ports=hops, netns=list(probes.netns_names))
    try:
        cp.start()
    except UserError as e:
        ui.note(f"connection-setup probe not loaded: {e}")
        return None
    probes.window_listeners.append(cp.set_window)   # the stages' windows: the setup steps are charged inside them
    return cp
