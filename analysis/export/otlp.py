"""`pathprof export RUN --format otlp`: each sampled transaction of a run (--trace-sample) as an OpenTelemetry
trace, sent to an OTLP/HTTP endpoint (protobuf, POST /v1/traces) or written as that request's body.

One trace per transaction (a chain of the probes' back-to-back spans, pathprof.analysis.report.waterfall):
- the root span `transaction` (from the first stage's start to the last one's end), sent by the host that holds
  the client's part; a host that does not (a server's agent) sends a span `host <name>` under the root's id;
- one child span per stage, named as the report names it (`wire.backend`, `runqueue.pgbench`, ...), with its
  start and duration as the probes measured them.
Trace and span ids: pathprof.analysis.export.otlp_ids (the same transaction seen by agents on two hosts gets
one trace id). Times are the run's CLOCK_MONOTONIC stamps moved to wall-clock time by the offset the agent
recorded at its measurement windows (run.json probes.windows); a merged run's traces are already on its first
host's clock.

Span attributes: `pathprof.stage`, `pathprof.leg`, `pathprof.role`, `pathprof.host` (the topology's host of the
process, or the agent's host), `process.pid`, `thread.id`, `pathprof.txn` (the agent's own transaction number).
Resource: `service.name` = pathprof, `service.version`, `host.name`, `pathprof.host`, `pathprof.run_id`,
`pathprof.topology`. Uses the OpenTelemetry SDK's span model and its OTLP exporter and encoder.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import pandas as pd
from pathprof.analysis.client import client_of
from pathprof.analysis.export import otlp_ids as ids
from pathprof.analysis.run_model import RunMeta
from pathprof.errors import UserError

SCOPE_NAME = "pathprof"


@dataclass
class Built:
    spans: list = field(default_factory=list)     # opentelemetry.sdk.trace.ReadableSpan
    traces: int = 0
    wire_ids: int = 0                             # traces whose id comes from the wire (join across hosts)
    complete: int = 0
    left_out: int = 0                             # spans in no chain of two


def wall_offset_ns(meta: dict | RunMeta) -> int:
    """Wall-clock minus CLOCK_MONOTONIC, from the pairs the agent stamped at its windows (0 when absent:
    a merged run's or an old run's traces are then placed at their monotonic time)."""
    pairs = []
    for w in RunMeta.of(meta or {}).probes.windows:
        for rt, mono in ((w.attach_realtime_ns, w.attach_mono_ns), (w.start_realtime_ns, w.start_mono_ns),
                         (w.end_realtime_ns, w.end_mono_ns), (w.detached_realtime_ns, w.detached_mono_ns)):
            if rt and mono:
                pairs.append(int(rt) - int(mono))
    return int(statistics.median(pairs)) if pairs else 0


def run_host(meta: dict | RunMeta) -> str:
    """The name of the host a run stands for: attach's scope.host, else the machine's hostname."""
    run = RunMeta.of(meta)
    return run.scope.host or run.host.hostname or "host"


def process_hosts(topology: dict | None, client: str = "pgbench") -> dict[str, str]:
    """role/hop name -> the topology host it runs on (topology.json chain: the client — pgbench, or the program
    `attach` found, named `client` in the spans —, hops, postgres -> backend)."""
    out = {}
    for e in (topology or {}).get("chain") or []:
        if not e.get("host"):
            continue
        if e.get("process") == "pgbench" or (e.get("role") == "client" and not e.get("hop")):
            out[client] = e["host"]
        elif e.get("process") == "postgres":
            out["backend"] = out["postmaster"] = e["host"]
        elif e.get("hop"):
            out[str(e["hop"]).removeprefix("hop.")] = e["host"]
    return out


def _resource(run: RunMeta, host: str):
    import pathprof
    from opentelemetry.sdk.resources import Resource
    topo = run.topology.name or ""
    return Resource({"service.name": "pathprof", "service.version": str(run.pathprof_version
                                                                         or pathprof.__version__),
                     "host.name": host, "pathprof.host": host, "pathprof.run_id": str(run.run_id or ""),
                     "pathprof.topology": str(topo)})


def _span(name, tid, sid, parent_sid, start, end, attrs, resource, scope):
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.trace import SpanContext, TraceFlags
    ctx = SpanContext(tid, sid, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    parent = (SpanContext(tid, parent_sid, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
              if parent_sid else None)
    return ReadableSpan(name, context=ctx, parent=parent, resource=resource, attributes=attrs,
                        start_time=int(start), end_time=int(end), instrumentation_scope=scope)


def build(traces: pd.DataFrame | None, messages: pd.DataFrame | None, meta: dict | RunMeta,
          topology: dict | None = None) -> Built:
    """The spans of every chain of sampled spans (complete transactions, and a host's part of one)."""
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from pathprof.analysis.report.waterfall import chain_rows
    run = RunMeta.of(meta)
    run_id = str(run.run_id or "")
    if traces is None or not len(traces):
        raise UserError(f"run {run_id or '?'} has no sampled traces (traces.parquet): record them with "
                        "`pathprof run --trace-sample N` (or `attach --trace-sample N`)")
    df, chains = chain_rows(traces)
    if not chains:
        raise UserError(f"run {run_id or '?'}: none of its {len(traces)} sampled spans forms a transaction "
                        "(no two spans chain end to start)")
    import pathprof
    scope = InstrumentationScope(SCOPE_NAME, str(run.pathprof_version or pathprof.__version__))
    agent_host = run_host(run)
    off = wall_offset_ns(run)
    cols = _Columns(df)
    out = Built(left_out=len(df) - sum(len(c) for c, _ in chains))
    client = client_of(run)
    plans = _plans(chains, cols, ids.Anchors(messages, run), run_id, agent_host, off, out, client)
    _emit(plans, cols, run, scope, process_hosts(topology, client), agent_host, off, out)
    return out


class _Columns:
    """The sampled spans' columns as lists (reading a DataFrame row per span is the slow way)."""

    def __init__(self, df: pd.DataFrame):
        self.lists = {c: df[c].tolist() for c in ("ts_ns", "dur_ns", "stage", "role", "leg", "txn", "pid", "tid")
                      if c in df.columns}
        self.hosts = df["host"].astype(str).tolist() if "host" in df.columns else None

    def __call__(self, name, i, default=None):
        v = self.lists.get(name)
        return default if v is None or pd.isna(v[i]) else v[i]

    def ts(self, i) -> int:
        return int(self.lists["ts_ns"][i])


def _plans(chains, col: _Columns, anchors, run_id: str, agent_host: str, off: int, out: Built,
           client: str = "pgbench") -> list:
    """Each chain's trace id (from the wire when another host can see the same request, else local), its host
    and its time span."""
    plans = []
    for rows, complete in chains:
        first = rows[0]
        res_host = col.hosts[first] if col.hosts else agent_host
        starts = [(col.ts(i), int(col("txn", i, -1))) for i in rows]
        hit = anchors.find(starts)
        if hit:
            tid = ids.trace_id(hit[0], hit[1])
            out.wire_ids += 1
        else:
            tid = ids.local_trace_id(run_id, res_host, int(col("tid", first, 0)), int(col("txn", first, -1)),
                                     starts[0][0])
        # the root starts at the client's request when this host sent it, though the request's wire and the
        # server's part are another host's spans
        t0 = min(starts[0][0], hit[2] if hit and hit[2] is not None else starts[0][0]) + off
        t1 = col.ts(rows[-1]) + int(col.lists["dur_ns"][rows[-1]]) + off
        plans.append((rows, complete, res_host, hit, tid, t0, t1, any(col("role", i) == client for i in rows)))
    return plans


def _emit(plans: list, col: _Columns, run: RunMeta, scope, where: dict, agent_host: str, off: int,
          out: Built) -> None:
    """The spans: per transaction and host one root (or a host span under the client's root), then its stages."""
    # A transaction whose spans came out as two chains on one host (a gap in the sampled spans at a window's
    # edge) keeps one root, spanning both, instead of a second detached part under a root the trace already has.
    span_of: dict[tuple, list] = {}
    for rows, complete, res_host, hit, tid, t0, t1, has_client in plans:
        iv = span_of.setdefault((tid, res_host), [t0, t1, False])
        iv[0], iv[1], iv[2] = min(iv[0], t0), max(iv[1], t1), iv[2] or has_client
    resources: dict[str, object] = {}
    rooted: set = set()
    for rows, complete, res_host, hit, tid, t0, t1, has_client in plans:
        resource = resources.get(res_host) or resources.setdefault(res_host, _resource(run, res_host))
        root = ids.root_span_id(tid)
        t0, t1, host_has_client = span_of[(tid, res_host)]
        txn_attrs = {"pathprof.host": res_host, "pathprof.complete": bool(complete),
                     "pathprof.trace_id.source": "wire" if hit else "local", "pathprof.spans": len(rows)}
        if hit:
            txn_attrs.update({"pathprof.connection": hit[0], "pathprof.tcp_seq": int(hit[1])})
        if host_has_client:
            parent = root
            if (tid, res_host) not in rooted:
                rooted.add((tid, res_host))
                out.spans.append(_span("transaction", tid, root, None, t0, t1, txn_attrs, resource, scope))
        else:
            parent = ids.host_span_id(tid, res_host)
            if (tid, res_host) not in rooted:
                rooted.add((tid, res_host))
                out.spans.append(_span(f"host {res_host}", tid, parent, root, t0, t1, txn_attrs, resource, scope))
        for i in rows:
            role, stage = str(col("role", i, "unknown")), str(col("stage", i, "span"))
            ts, dur, thread = col.ts(i), max(int(col("dur_ns", i, 0)), 0), int(col("tid", i, 0))
            attrs = {"pathprof.stage": stage, "pathprof.leg": str(col("leg", i, "")), "pathprof.role": role,
                     "pathprof.host": (col.hosts[i] if col.hosts else where.get(role, agent_host)),
                     "process.pid": int(col("pid", i, 0)), "thread.id": thread,
                     "pathprof.txn": int(col("txn", i, -1))}
            sid = ids.span_id(tid, res_host, stage, ts, thread)
            out.spans.append(_span(stage, tid, sid, parent, ts + off, ts + off + dur, attrs, resource, scope))
        out.complete += bool(complete)
    out.traces = len(rooted)          # transactions: chains of one transaction on one host count once


def build_from_run(rd) -> Built:
    return build(rd.read_frame("traces.parquet"), rd.read_frame("messages.parquet"), rd.run,
                 rd.read_json("topology.json"))
