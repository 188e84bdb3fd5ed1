"""One measurement pipeline behind `run` (owned.py), `run --dsn` (dsn.py) and `attach` (attach.py).

A measurement is a **path source** (what the probes follow and what topology.json says about it: a path pathprof
built, or one it discovered) and a **load driver** (what makes the transactions and what run.json says about their
rate: pgbench, or the traffic already flowing), around one core. Read side by side (#23), the three commands were:

  phase            run (built path)                 run --dsn                       attach
  refuse early     topology, hops' check_workload,  workload; the server's free     --probes off, --duration
                   workload, WAL device, limits     connections                     bounds
  capabilities     doctor.require                   doctor.require                  doctor.require
  path source      built: namespaces, owned server, discovered from pathprof's own  discovered from a port, pid,
                   hops (owned.py)                  connection                      DSN or remote address
  run.json head    version, host, topology,         the same                        the same + postgres, scope
                   workload, status, journal
  probes           loaded in the background during  loaded before pgbench           loaded before the interval
                   the set-up; track_path           profiled_path.track (no         profiled_path.track
                                                    clients: pgbench is one)
  load driver      pgbench in the client namespace  pgbench, the DSN's secret in    observed: a one-second watch
                   (+ pooler counters, -C probe)    its environment                 of the probes' own counts
  interval opens   pgbench's start                  pgbench's start                 once the path is tracked
  live             status.json, LiveBreakdown,      LiveBreakdown, progress         exchanges counted by the
                   progress                         (status.json since #23.3)       probes (observed.py;
                                                                                    status.json since #23.3)
  interval closes  CPU, TCP counters, windows, read CPU, windows, read              windows, read
  results          pgbench logs -> percentiles,     the same + discovered-path      save_probe_result, always-on
                   window_meta, save_probe_result;  notes                           schedule, observed_result
                   -C frame, pooler, checkpoints
  way out          status before the teardown,      recording(rd)                   recording(rd)
                   complete after it

What was common is here, once: the run.json head (`record_head`), the measured interval (`Measurement`: open when
the load starts, the CPU clock, close and read the probes), the one live snapshot (`LiveFeed`: each tick writes
status.json when the run keeps one, computes the probes' breakdown with agent.probing.live_breakdown.breakdown and
hands the same snapshot to the Reporter, which the terminal and the --metrics-port endpoint both render), the
pgbench load driver (`drive_pgbench`, the one place pgbench is started), the pgbench results phase
(`pgbench_logs`, `pgbench_results`), a discovered path (`DiscoveredSource`), and the way out
(agent.run.outcome.recording, with the built path's teardown as its `cleanup`).

The sources and drivers, and the three commands as compositions of them:

  path sources     built.py (BuiltPath: preflight, claim, build, teardown)   DiscoveredSource (here)
  load drivers     pgbench: drive_pgbench (here), with owned.py _drive/_results  observed.py (watch, observed_result)
                   and dsn.py _measure around it
  run              built.BuiltPath + owned._drive (drive_pgbench) + Measurement + LiveFeed + pgbench_results
  run --dsn        DiscoveredSource(clients=False) + dsn._measure (drive_pgbench) + Measurement + LiveFeed
                   + pgbench_results
  attach           DiscoveredSource + Measurement.open_probes + observed.watch (LiveFeed) + observed_result
  (every LiveFeed keeps status.json: LiveFeed.keeping_status)

What differs stays with its command, on purpose: building, starting and tearing down a path, the pooler counters,
the -C probe and the broken-path checks belong to a path pathprof owns (built.py, owned.py: its hooks at
pgbench's start and its path_broken go to drive_pgbench); a DSN's connection check and its pgbench command line
(dsn.py); resolving an attach target and the second look at its clients (attach.py).
"""
from __future__ import annotations

import os
import time

import pathprof
from pathprof.agent.host.machine import cpu_times, host_info
from pathprof.analysis.rundir import RunDir


def record_head(rd: RunDir, topology: dict, workload: dict, **fields) -> None:
    """run.json's first keys, written the same way by every command (`fields`: status, and what one adds)."""
    from pathprof.agent.host import machine_costs
    rd.update(pathprof_version=pathprof.__version__, host=host_info(), topology=topology, workload=workload,
              machine_costs=machine_costs.current(), **fields)


class Measurement:
    """The measured interval: the probes zeroed and their windows started when the load starts (`open`), the
    machine's CPU sampled at both ends (`cpu`), the windows closed and the probes read at the end (`read`).
    `probes` may be None (--probes off): the interval is then the CPU clock alone."""

    def __init__(self, probes, ui, duration_s: float):
        self.probes, self.ui, self.duration_s = probes, ui, duration_s
        self.cpu0 = self.t0 = None

    def open(self, client_pid: int | None = None) -> None:
        self.open_probes(client_pid)
        self.start_clock()

    def open_probes(self, client_pid: int | None = None, ready=None) -> None:
        """ready: when the load's own start-up is over (pgbench.setup_done); the windows count from then."""
        if self.probes is not None:
            if client_pid is not None:
                self.probes.track(client_pid, "pgbench")
            self.probes.reset()
            self.probes.start_windows(self.duration_s, ready)

    def start_clock(self) -> None:
        self.cpu0, self.t0 = cpu_times(), time.monotonic_ns()

    def cpu(self) -> dict:
        """run.json `cpu` for the interval so far: the machine's busy and total CPU time, the elapsed time."""
        c1, t1, c0 = cpu_times(), time.monotonic_ns(), self.cpu0
        out = {k: c1[k] - c0[k] for k in ("busy_ns", "total_ns", "busy_tick_ns", "asleep_ns", "steal_ns")}
        out.update(elapsed_ns=t1 - self.t0, ncpu=os.cpu_count(), busy_source=c1["busy_source"])
        if c0["busy_source"] != c1["busy_source"]:
            out.update(busy_ns=out["busy_tick_ns"], busy_source="tick")
        return out

    def read(self):
        """The load is done: no window may outlive it; the probes' result (None without probes)."""
        if self.probes is not None:
            self.probes.stop_windows()
        self.ui.phase("reading results")
        return self.probes.stop() if self.probes is not None else None


class LiveFeed:
    """The one live snapshot. Called with each progress line (pgbench's, or attach's own), it writes status.json
    (when the run keeps one), computes the probes' breakdown and passes the same snapshot to the Reporter: the
    terminal's live view and the --metrics-port endpoint (agent.cli.metrics_live) both render what it passes.

    The breakdown is the windowed one (agent.probing.live_breakdown.LiveBreakdown over pgbench's progress, from
    the interval's start `t0()`) unless the caller gives its own (attach: the probes' exchange count)."""

    def __init__(self, probes, ui, t0=None, status=None):
        self.probes, self.ui, self.t0, self.status = probes, ui, t0, status
        self.history: list = []
        self._windowed = None

    @classmethod
    def keeping_status(cls, rd: RunDir, probes, ui, every_s: float, duration_s: float | None, t0=None) -> LiveFeed:
        """The feed of a run that keeps <run dir>/status.json (agent.run.status; every_s 0: never written).
        Every command keeps one: run, run --dsn and attach."""
        from pathprof.agent.run.status import StatusFile
        return cls(probes, ui, t0=t0, status=StatusFile(rd.file("status.json"), probes, every_s, duration_s))

    def close(self) -> None:
        """Before the probes are read or closed: a status.json write in flight reads their maps."""
        if self.status is not None:
            self.status.close()

    def __call__(self, pr, breakdown: dict | None = None) -> None:
        if self.status is not None:
            self.status.update(pr)
        self.history.append(pr)
        snap = None
        if self.probes is not None:
            snap = {**self.probes.snapshot(), **(breakdown if breakdown is not None else self._refresh())}
        self.ui.progress(pr, snap)

    def _refresh(self) -> dict:
        if self._windowed is None:
            from pathprof.agent.probing.live_breakdown import LiveBreakdown
            self._windowed = LiveBreakdown(self.probes, self.t0())
        return self._windowed.refresh(self.history)


def drive_pgbench(netns: str | None, argv: list[str], rd: RunDir, workload, ui, feed: LiveFeed, on_start,
                  **hooks):
    """The pgbench load driver, started here for `run` and `run --dsn`: its phase line, then pgbench to
    completion with each progress line into `feed` and the measured interval opened by `on_start(pid)`.
    hooks: what pgbench.run takes besides (a DSN's secret `env`, `should_stop`, `path_broken`, `on_progress`
    in place of the feed)."""
    from pathprof.agent.postgres import pgbench
    ui.phase(f"pgbench: {workload.clients} clients, {workload.duration_s} s")
    on_progress = hooks.pop("on_progress", feed)
    return pgbench.run(netns, argv, rd.file("pgbench"), on_progress=on_progress, on_start=on_start, **hooks)


def pgbench_logs(result, log_dir, presult, connect: bool = False):
    """One streaming pass over pgbench's per-transaction logs (memory flat in the run's length): the windows
    split (analysis.windows.LogStats, returned) and the percentiles filled into `result`. The logs are left
    uncompressed for `pgbench_results`, which gzips them while the probes' tables are saved."""
    from pathprof.agent.postgres import pgbench
    logs = pgbench.log_stats(log_dir, presult.windows if presult is not None else [], connect=connect)
    pgbench.finish(result, log_dir, percentiles=logs.percentiles(), compress=False)
    return logs


def pgbench_results(rd: RunDir, log_dir, presult, logs, meta_probes: dict, capabilities, schedule: tuple) -> dict:
    """run.json `probes` of a pgbench-driven run: `meta_probes` with the probes' tables saved and the windows'
    keys (schedule: window_s, period_s), while the pgbench logs are gzipped on a thread."""
    from pathprof.agent.postgres import pgbench
    from pathprof.agent.run import recorder
    from pathprof.agent.run.background import in_background
    with in_background(pgbench.compress_logs, log_dir):
        if presult is not None:
            from pathprof.agent.probing.windows import window_meta
            meta_probes.update(recorder.save_probe_result(rd, presult, capabilities))
            meta_probes.update(window_meta(presult.windows, logs, *schedule))
    return meta_probes


class DiscoveredSource:
    """A path pathprof did not build (`run --dsn`, `attach`): a socket table and the chain found in it, profiled
    as far as it is on this machine (agent.discovery.profiled_path)."""

    def __init__(self, table, path):
        self.table, self.path = table, path

    def announce(self, ui) -> None:
        from pathprof.agent.discovery import profiled_path
        for line in profiled_path.summary_lines(self.table, self.path):
            ui.note(f"path: {line}")

    def session(self, level: str, trace_sample: int, window_s: float, period_s: float, client: str = "pgbench"):
        """The probe session of the path; `client` names the client's spans (attach: its program's name)."""
        from pathprof.agent.discovery import profiled_path
        from pathprof.agent.probing.session import ProbeSession
        return ProbeSession(profiled_path.probe_config(self.table, self.path, level, trace_sample, window_s,
                                                       period_s, client))

    def attach_probes(self, probes, ui, level: str, clients: bool = True) -> None:
        """Load the probes and follow the path's processes (its clients too, unless the load driver's own
        client is the one to follow)."""
        from pathprof.agent.discovery import profiled_path
        ui.phase(f"loading probes ({level})")
        probes.start()
        profiled_path.track(probes, self.path, clients=clients)

    def write_topology(self, rd: RunDir, source: str) -> None:
        from pathprof.agent.discovery import profiled_path
        rd.write_json("topology.json", profiled_path.topology_doc(self.table, self.path, source))

    def notes(self) -> list[str]:
        from pathprof.agent.discovery import profiled_path
        return [f"discovered path: {line}" for line in profiled_path.summary_lines(self.table, self.path)]
