"""The typed run model: run.json (`pathprof-run/1.x`, analysis/schemas/run.schema.json) and the run/report
document (`pathprof report --json`, analysis/schemas/summary.schema.json) as dataclasses.

Readers (reports, exports, diff/compare/explain) take these instead of dicts read by string keys. The model only
reads: the documents themselves are written by their owners (the agent writes run.json, analysis.summary builds
the report document) and every object keeps the dict it was read from as `doc`, so what is written and printed
stays exactly what it was. Loading is lenient the way the readers were: a key an older run lacks reads as None
(or an empty section/list), keys this model does not know are kept in `doc`, so every 1.x run directory loads.

Sections every document has (closure, latency_ms, workload, host, ...) are always objects; sections a run may
lack (windows, tcp_retransmits, prediction, a gap, ...) are None when absent or empty, as `x.get(k) or {}` read
them."""
from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from functools import cache
from typing import Any


def _doc_field():
    return field(default_factory=dict, repr=False, compare=False)


@cache
def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _model_of(tp) -> tuple[str, type | None]:
    """('one'|'list'|'', the dataclass) for a field's annotation: X, X | None, list[X]."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return "one", tp
    if origin is list:
        (arg,) = typing.get_args(tp)
        return ("list", arg) if dataclasses.is_dataclass(arg) else ("", None)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            if dataclasses.is_dataclass(arg):
                return "optional", arg
    return "", None


def load(cls, doc):
    """`cls` filled from the dict `doc` by field name (nested sections by their annotation); `doc` kept whole."""
    doc = doc if isinstance(doc, dict) else {}
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name == "doc":
            continue
        kind, model = _model_of(_hints(cls)[f.name])
        key = f.metadata.get("key", f.name)
        raw = doc.get(key)
        if kind == "one":
            values[f.name] = load(model, raw)
        elif kind == "optional":
            values[f.name] = load(model, raw) if isinstance(raw, dict) and raw else None
        elif kind == "list":
            values[f.name] = [load(model, x) for x in raw or [] if isinstance(x, dict)]
        elif key in doc:
            values[f.name] = raw
    return cls(**values, doc=doc)


# --- run.json -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Host:
    kernel: str | None = None
    cpus: int | None = None
    hostname: str | None = None
    os: str | None = None
    machine: str | None = None
    cpu_speed: dict | None = None       # the machine's speed through the load (analysis.speed.sampled_*)
    doc: dict = _doc_field()


@dataclass(frozen=True)
class Topology:
    name: str | None = None
    source: str | None = None
    options: dict | None = None
    spec: dict | None = None
    doc: dict = _doc_field()


@dataclass(frozen=True)
class Workload:
    clients: int | None = None
    threads: int | None = None
    duration_s: float | None = None
    mode: str | None = None
    script: str | None = None
    connect: bool | None = None
    scale: int | None = None
    rate: float | None = None
    client: str | None = None   # the client's name in stage names (analysis.client); None: pgbench (run, run --dsn)
    doc: dict = _doc_field()


@dataclass(frozen=True)
class LatencyMs:
    mean: float | None = None
    p50: float | None = None
    p95: float | None = None
    p99: float | None = None
    doc: dict = _doc_field()


@dataclass(frozen=True)
class LoadResult:
    """pgbench's result (run, run --dsn) or what the probes observed (attach: `source` "probes")."""
    tps: float | None = None
    transactions: int | None = None
    failed: int | None = None
    latency_ms: LatencyMs = field(default_factory=LatencyMs)
    connection_time_ms: float | None = None
    scripts: list | None = None
    duration_s: float | None = None
    source: str | None = None
    active_connections: int | None = None   # attach: the client connections that sent a request in the interval
    client_s: float | None = None           # attach: their time, first request to last (agent.run.observed)
    doc: dict = _doc_field()


@dataclass(frozen=True)
class Pgbench:
    argv: list | None = None
    version: str | None = None
    result: LoadResult | None = None
    doc: dict = _doc_field()


@dataclass(frozen=True)
class Checkpoints:
    timed: int | None = None
    requested: int | None = None
    during_run: int | None = None
    doc: dict = _doc_field()


@dataclass(frozen=True)
class Postgres:
    owned: bool | None = None
    version: str | None = None
    pid: int | None = None
    port: int | None = None
    settings: dict | None = None
    checkpoints: Checkpoints = field(default_factory=Checkpoints)
    wal_device: dict | None = None      # --wal-device: the WAL's own device, its size and throttle
    doc: dict = _doc_field()


@dataclass(frozen=True)
class CpuTime:
    busy_ns: float | None = None
    elapsed_ns: float | None = None
    ncpu: int | None = None
    total_ns: float | None = None
    machines: dict | None = None        # merged runs: machine -> its hosts (analysis.merge_cpu)
    busy_tick_ns: float | None = None     # /proc/stat's tick-sampled busy time (1.2; busy_ns is it before)
    asleep_ns: float | None = None        # the CPUs' no-HZ idle + iowait sleep (1.2, busy_source "nohz")
    steal_ns: float | None = None         # /proc/stat's steal: a hypervisor ran others on these CPUs (1.3)
    busy_source: str | None = None        # "nohz" | "tick"; absent (< 1.2): tick
    doc: dict = _doc_field()


@dataclass(frozen=True)
class Schedule:
    window_s: float | None = None
    period_s: float | None = None
    duty_pct: float | None = None
    always_on: bool | None = None
    doc: dict = _doc_field()


@dataclass(frozen=True)
class WindowFigures:
    """The transactions inside (or outside) the probe windows."""
    txns: int | None = None
    duration_s: float | None = None
    tps: float | None = None
    latency_ms_mean: float | None = None
    busy_ns: float | None = None
    elapsed_ns: float | None = None
    client_s: float | None = None     # in windows: the clients' time, each to its own last transaction
    opening_s: float | None = None    # ...less each one's transaction in flight at an opening (analysis.windows)
    busy_tick_ns: float | None = None     # /proc/stat's tick-sampled busy time (1.2; busy_ns is it before)
    asleep_ns: float | None = None        # the CPUs' no-HZ idle + iowait sleep (1.2, busy_source "nohz")
    steal_ns: float | None = None         # /proc/stat's steal: a hypervisor ran others on these CPUs (1.3)
    busy_source: str | None = None        # "nohz" | "tick"; absent (< 1.2): tick
    doc: dict = _doc_field()


@dataclass(frozen=True)
class ProbeWindow:
    """One measurement window: when the probes were attached, counted, and detached (both clocks), and the CPU
    time the machine was busy while it was open."""
    attach_mono_ns: int | None = None
    attach_realtime_ns: int | None = None
    start_mono_ns: int | None = None
    start_realtime_ns: int | None = None
    end_mono_ns: int | None = None
    end_realtime_ns: int | None = None
    detached_mono_ns: int | None = None
    detached_realtime_ns: int | None = None
    busy_ns: int | None = None
    total_ns: int | None = None
    elapsed_ns: int | None = None
    busy_tick_ns: float | None = None     # /proc/stat's tick-sampled busy time (1.2; busy_ns is it before)
    asleep_ns: float | None = None        # the CPUs' no-HZ idle + iowait sleep (1.2, busy_source "nohz")
    steal_ns: float | None = None         # /proc/stat's steal: a hypervisor ran others on these CPUs (1.3)
    busy_source: str | None = None        # "nohz" | "tick"; absent (< 1.2): tick
    doc: dict = _doc_field()


@dataclass(frozen=True)
class ProbeCost:
    run_time_ns: float | None = None
    run_cnt: int | None = None
    doc: dict = _doc_field()


@dataclass(frozen=True)
class Probes:
    level: str | None = "off"           # absent: an old run recorded without probes
    cost: ProbeCost | None = None
    conn_cost: ProbeCost | None = None
    lost: dict | None = None
    notes: list | None = None
    counters: dict | None = None
    capabilities: Any = None
    schedule: Schedule | None = None
    windows: list[ProbeWindow] = field(default_factory=list)
    in_windows: WindowFigures | None = None
    outside_windows: WindowFigures | None = None
    probe_overhead_pct: float | None = None
    probe_overhead_run_pct: float | None = None
    doc: dict = _doc_field()


@dataclass(frozen=True)
class Service:
    kind: str | None = None
    hop: str | None = None
    role: str | None = None
    netns: str | None = None
    accelerator: str | None = None
    vhost: Any = None
    doc: dict = _doc_field()


@dataclass(frozen=True)
class LeavingConnection:
    """A connection of this host's that leaves it (attach on several machines): the socket and, after any NAT,
    the tuple on the wire."""
    side: str | None = None
    pid: int | None = None
    local: str | None = None
    remote: str | None = None
    wire_local: str | None = None
    wire_remote: str | None = None
    nat: bool | None = None
    doc: dict = _doc_field()


@dataclass(frozen=True)
class Scope:
    host: str | None = None
    netns: str | None = None
    hostname: str | None = None
    whole_machine: bool | None = None
    leaving_connections: list[LeavingConnection] = field(default_factory=list)
    doc: dict = _doc_field()


@dataclass(frozen=True)
class RunMeta:
    """run.json. `status` is one of running, complete, failed, interrupted, killed; a run that did not complete
    may lack every result section."""
    schema: str | None = None
    run_id: str | None = None
    created: str | None = None
    pathprof_version: str | None = None
    status: str | None = None
    error: str | None = None
    journal: str | None = None
    host: Host = field(default_factory=Host)
    topology: Topology = field(default_factory=Topology)
    workload: Workload = field(default_factory=Workload)
    pgbench: Pgbench = field(default_factory=Pgbench)
    observed: LoadResult | None = None
    postgres: Postgres = field(default_factory=Postgres)
    services: list[Service] = field(default_factory=list)
    cpu: CpuTime = field(default_factory=CpuTime)
    probes: Probes = field(default_factory=Probes)
    setup_s: dict | None = None
    failure: list | None = None
    tcp_counters: dict | None = None
    pooler_counters: dict | None = None
    cpu_quotas: list | None = None       # quota'd cgroups of the run's processes (agent.host.cpu_quota)
    machine_costs: dict | None = None    # the machine's costs known at the run's start (agent.host.machine_costs)
    delay_lines: list | None = None      # each link delay line's CPU and packets over the measured interval
    scope: Scope = field(default_factory=Scope)
    hosts: list | None = None            # a merged run (1.1): its hosts and clocks
    clock_offsets: list | None = None
    links: list | None = None
    doc: dict = _doc_field()

    @classmethod
    def of(cls, meta: dict | RunMeta) -> RunMeta:
        """The model of a run.json document (a RunMeta is returned as it is)."""
        return meta if isinstance(meta, RunMeta) else load(cls, meta)

    @property
    def load_result(self) -> LoadResult | None:
        """A driven run's pgbench result, else what the probes observed (attach); None for neither."""
        return self.pgbench.result or self.observed

    @property
    def driver(self) -> str:
        """Who drove the load: pgbench (run), or clients pathprof only watched (attach: "observed")."""
        return "observed" if not self.pgbench.result and self.observed else "pgbench"


# --- the run/report document (analysis.summary.summarize) ----------------------------------------------------

@dataclass(frozen=True)
class Stage:
    """One row of the latency view: µs per transaction in a stage on a leg (`parent`/`part`: a stage's parts)."""
    name: str | None = None
    leg: str | None = None
    us_per_txn: float | None = None
    p50_us: float | None = None
    p99_us: float | None = None
    count_per_txn: float | None = None
    parent: str | None = None
    part: bool | None = None
    inclusive_us: float | None = None
    phase: str | None = None
    doc: dict = _doc_field()


@dataclass(frozen=True)
class CpuComponent:
    component: str | None = None
    us_per_txn: float | None = None
    host: str | None = None             # merged runs: where it ran (analysis.merge_cpu)
    doc: dict = _doc_field()


@dataclass(frozen=True)
class ConnectionStep:
    """A connection-setup step (-C runs), per connection."""
    name: str | None = None
    us_per_conn: float | None = None
    p50_us: float | None = None
    p99_us: float | None = None
    count: int | None = None
    divisor: int | None = None      # the connections its mean is over (analysis.gap.connect_divisors checks it)
    doc: dict = _doc_field()


@dataclass(frozen=True)
class Gap:
    """closure.gap (analysis.gap.locate_gap): where a latency view that does not close falls short."""
    short_us_per_txn: float | None = None
    leg: str | None = None
    receiver: str | None = None
    link: str | None = None
    interval: str | None = None
    count_per_txn: float | None = None
    expected_per_txn: float | None = None
    statement: str | None = None
    evidence: str | None = None
    doc: dict = _doc_field()


@dataclass(frozen=True)
class ExecuteSplit:
    """closure.execute_split (deep runs): backend.execute against its exclusive parts (waits and I/O)."""
    execute_us: float | None = None
    parts_us: float | None = None
    other_raw_us: float | None = None
    parts_pct: float | None = None
    doc: dict = _doc_field()


@dataclass(frozen=True)
class Closure:
    latency_error_pct: float | None = None
    cpu_error_pct: float | None = None
    cpu_reference: str | None = None        # what the CPU view closed against: "nohz" | "tick" (before 1.2)
    cpu_error_tick_pct: float | None = None  # nohz runs: the closure /proc/stat's tick-sampled busy time gave
    latency_basis: str | None = None
    cycle_us: float | None = None
    stages_sum_us: float | None = None
    connection_setup_us: float | None = None
    connection_measured_us: float | None = None
    connection_measured_in_windows_us: float | None = None   # pgbench's, scaled to the windows (conn_view)
    connection_error_pct: float | None = None
    gap: Gap | None = None
    execute_split: ExecuteSplit | None = None
    txns: int | None = None                 # the transactions the latency view is divided by
    connect_divisors: dict | None = None    # -C: setup steps divided by other than those (analysis.gap)
    doc: dict = _doc_field()


@dataclass(frozen=True)
class Windows:
    """The measurement windows the stage figures come from, with the rates inside and outside them."""
    count: int | None = None
    window_s: float | None = None
    period_s: float | None = None
    duty_pct: float | None = None
    always_on: bool | None = None
    txns_in: int | None = None
    tps_in: float | None = None
    txns_out: int | None = None
    tps_out: float | None = None
    probe_overhead_run_pct: float | None = None
    doc: dict = _doc_field()


@dataclass(frozen=True)
class Retransmits:
    """Retransmissions of one kind by one sender on one leg."""
    leg: str | None = None
    kind: str | None = None
    sender: str | None = None
    count: int | None = None
    doc: dict = _doc_field()


@dataclass(frozen=True)
class TcpRetransmits:
    by_leg: list[Retransmits] = field(default_factory=list)
    count: int | None = None
    per_txn: float | None = None
    wait_us_per_txn: float | None = None
    wait_share_pct: float | None = None
    kernel_retrans_segs: int | None = None
    doc: dict = _doc_field()


@dataclass(frozen=True)
class Prediction:
    unprobed_tps: float | None = None
    measured_outside_tps: float | None = None
    error_pct: float | None = None
    doc: dict = _doc_field()


@dataclass(frozen=True)
class DiskRow:
    """A block device's time per transaction while probed, per operation."""
    device: str | None = None
    op: str | None = None
    requests_per_txn: float | None = None
    us_per_txn: float | None = None
    mean_us: float | None = None
    p99_us: float | None = None
    doc: dict = _doc_field()


@dataclass(frozen=True)
class Statement:
    sql: str | None = None
    latency_ms: float | None = None
    failures: int | None = None
    doc: dict = _doc_field()


@dataclass(frozen=True)
class Script:
    """pgbench -r: one script (a transaction type) with its statements."""
    name: str | None = None
    weight: float | None = None
    transactions: int | None = None
    tps: float | None = None
    latency_ms: LatencyMs = field(default_factory=LatencyMs)
    statements: list[Statement] = field(default_factory=list)
    doc: dict = _doc_field()


@dataclass(frozen=True)
class Loss:
    name: str | None = None
    count: int | None = None
    of: int | None = None
    of_what: str | None = None
    share_pct: float | None = None
    text: str | None = None
    doc: dict = _doc_field()


@dataclass(frozen=True)
class Summary:
    """The run/report document. `doc` is what `--json` prints; `label` is set by compare and sweep."""
    topology: str | None = None
    label: str | None = None
    run_id: str | None = None
    clients: int | None = None
    threads: int | None = None
    duration_s: float | None = None
    workload: Workload = field(default_factory=Workload)
    tps: float | None = None
    tps_whole_run: float | None = None
    tps_in_windows: float | None = None
    tps_basis: str | None = None
    transactions: int | None = None
    failed: int | None = None
    latency_ms: LatencyMs = field(default_factory=LatencyMs)
    connection_time_ms: float | None = None
    scripts: list[Script] = field(default_factory=list)
    regime: str | None = None
    predicted_tps: float | None = None
    predicted_probed_tps: float | None = None
    prediction: Prediction | None = None
    stages: list[Stage] = field(default_factory=list)
    cpu: list[CpuComponent] = field(default_factory=list)
    cpu_us_per_txn: float | None = None
    busy_cpus: float | None = None
    closure: Closure = field(default_factory=Closure)
    probe_cost_ns_per_txn: float | None = None
    probe_cost_share_pct: float | None = None
    probe_cost_share_of: str | None = None
    probe_overhead_pct: float | None = None
    probes: str | None = None           # the probe level: off, basic, deep
    lost_events: dict | None = None
    losses: list[Loss] = field(default_factory=list)
    host: Host = field(default_factory=Host)
    topology_options: dict | None = None
    postgres_version: str | None = None
    pathprof_version: str | None = None
    status: str | None = None
    setup_s: dict | None = None
    notes: list | None = None
    run_dir: str | None = None
    driver: str | None = None
    windows: Windows | None = None
    scheduler: list | None = None
    tcp_retransmits: TcpRetransmits | None = None
    connect_retransmits: dict | None = None   # -C: SYN/SYN-ACK and setup-message retransmissions (conn_view)
    disk: list[DiskRow] = field(default_factory=list)
    connection_setup: list[ConnectionStep] = field(default_factory=list)
    connection_async: list[ConnectionStep] = field(default_factory=list)
    connection_cpu: list[ConnectionStep] = field(default_factory=list)
    connection_probe: dict | None = None
    pooler_counters: list | None = None
    cpu_quotas: list | None = None           # each quota'd cgroup with its own throttled count (quota_check)
    served_by: dict | None = None            # sampled transactions and the backend that served each (served.py)
    failure: list | None = None
    checkpoints: dict | None = None
    accelerator: str | None = None
    vhost: Any = None
    hosts: list | None = None
    clock_offsets: list | None = None
    doc: dict = _doc_field()

    @classmethod
    def of(cls, doc: dict | Summary) -> Summary:
        """The model of a report document (a Summary is returned as it is)."""
        return doc if isinstance(doc, Summary) else load(cls, doc)
