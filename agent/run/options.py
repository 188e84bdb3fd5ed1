"""What a run is asked to do (RunOptions) and what it tells the user while it works (Reporter)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pathprof.agent.postgres import pgbench
from pathprof.agent.probing.windows import DEFAULT_PERIOD_S, DEFAULT_WINDOW_S


@dataclass
class RunOptions:
    topology: str
    workload: pgbench.Workload
    pg_settings: dict[str, str] = field(default_factory=dict)
    dsn: str | None = None
    probes: str = "basic"
    runs_dir: Path = Path("runs")
    topo_options: dict[str, str] = field(default_factory=dict)
    links: list[str] = field(default_factory=list)   # --link WHERE:KEY=VALUE,... (topologies.impairments)
    trace_sample: int = 0
    wal_device_mb: int = 0           # the WAL on a loop device of its own (agent.host.storage); 0 = with the data
    wal_device_limit: dict[str, int] = field(default_factory=dict)   # throttle on it (agent.host.io_limit)
    cpu_quota: dict = field(default_factory=dict)   # who -> agent.host.cpu_quota.Quota: a pp- cgroup caps it
    probe_window_s: float = DEFAULT_WINDOW_S   # detailed probes attached this long every probe_period_s
    probe_period_s: float = DEFAULT_PERIOD_S
    probe_lo_device: bool = False    # dev.lo as its own stage (two more programs per packet on lo)
    status_every_s: float = 10.0     # <run dir>/status.json rewritten this often while pgbench runs (0: never)
    netns: str | None = None         # run --dsn from this namespace, standing for the client's machine
    host_name: str | None = None     # this host's name in merged runs (run.json scope.host)
    start_at: float | None = None    # run --dsn: pgbench starts at this wall-clock time (agent.run.start_at)
    schedule_note: str | None = None  # why the probe schedule is not the one asked for (lossy_schedule)


class Reporter:
    """What a run tells the user while it works; the CLI supplies a live view or plain lines."""

    def phase(self, text: str) -> None: ...
    def progress(self, pr: pgbench.Progress, probe_snapshot: dict | None) -> None: ...
    def note(self, text: str) -> None: ...


def lossy_schedule(opts: RunOptions, topo) -> tuple[RunOptions, str | None]:
    """A link that loses packets and the default probe schedule: the probes always on, and the note that says so.

    A TCP recovery wait (a tail-loss probe ~200 ms after the send, a retransmission timeout of 200 ms and more)
    that begins before a window opens has no start inside it: with 2 s windows a sizeable share of the waits
    straddle an edge, and the latency view came out 10-19 % short (bench/closure --matrix loss with the default
    windows, 2026-11-25). A schedule the user chose is kept."""
    from dataclasses import replace
    lossy = any(n.loss_pct for link in topo.links for _, n in link.impairments())
    default = opts.probe_window_s == DEFAULT_WINDOW_S and opts.probe_period_s == DEFAULT_PERIOD_S
    if not (lossy and default and opts.probes != "off"):
        return opts, None
    note = ("a link of this path loses packets: the probes are on for the whole run (a retransmission wait begun "
            "before a measurement window would have no start in it), so the TPS reported is the probed one; "
            "--probe-duty or --probe-window/--probe-period choose a schedule")
    return replace(opts, probe_period_s=0.0, schedule_note=note), note
