"""A run's figures in the OpenMetrics text format (what Prometheus scrapes; `pathprof export --format openmetrics`
and the live `--metrics-port` endpoint).

Families (every sample labelled with run and topology):
  pathprof_run_info{run, topology, regime, pathprof_version}      info
  pathprof_clients                                                gauge
  pathprof_tps                                                    gauge, measured transactions per second
  pathprof_predicted_tps                                          gauge, the model's unprobed prediction
  pathprof_latency_seconds{stat=mean|p50|p95|p99}                 gauge, the client's per-transaction latency
  pathprof_stage_per_transaction_seconds{stage, leg}              gauge, the latency view (mean per transaction)
  pathprof_cpu_per_transaction_seconds{component}                 gauge, the CPU view
  pathprof_closure_error_ratio{view=latency|cpu}                  gauge, (sum − measured) / measured
  pathprof_probe_cost_per_transaction_seconds                     gauge
  pathprof_stage_duration_seconds{stage, leg}                     histogram of one stage occurrence, from the
                                                                  probes' log-linear histograms (stages.parquet)
Units are seconds, as OpenMetrics asks; the gauges are per transaction, the histogram per occurrence.
"""
from __future__ import annotations

import math

from pathprof.analysis.histogram import slot_bounds
from pathprof.analysis.run_model import Summary

CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"


def _esc(value) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: dict) -> str:
    items = [(k, v) for k, v in labels.items() if v is not None]
    return "{" + ",".join(f'{k}="{_esc(v)}"' for k, v in items) + "}" if items else ""


def _val(x: float) -> str:
    return repr(float(x)) if math.isfinite(float(x)) else ("+Inf" if x > 0 else "-Inf" if x < 0 else "NaN")


class _Doc:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.seen: set[str] = set()

    def family(self, name: str, kind: str, help_text: str, unit: str | None = None) -> None:
        assert name not in self.seen, name
        self.seen.add(name)
        self.lines.append(f"# TYPE {name} {kind}")
        if unit:
            self.lines.append(f"# UNIT {name} {unit}")
        self.lines.append(f"# HELP {name} {_esc(help_text)}")

    def sample(self, name: str, labels: dict, value: float) -> None:
        self.lines.append(f"{name}{_labels(labels)} {_val(value)}")

    def text(self) -> str:
        return "\n".join(self.lines + ["# EOF"]) + "\n"


def _num(x):
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def render(summaries: list[dict | Summary], histograms: dict[str, list[dict]] | None = None) -> str:
    """OpenMetrics text for one or more summaries (analysis.summary or a live snapshot of the same shape).
    histograms: run label -> stage_histograms() of that run, when the stage tables are at hand."""
    doc = _Doc()
    runs = [(_run_labels(s), s) for s in map(Summary.of, filter(None, summaries))]
    if not runs:
        return doc.text()
    doc.family("pathprof_run", "info", "the run this series belongs to")
    for lb, s in runs:
        doc.sample("pathprof_run_info", {**lb, "regime": s.regime or "unknown",
                                         "pathprof_version": s.pathprof_version or ""}, 1)
    scalar = [("pathprof_clients", "client connections", None, lambda s: s.clients, 1.0),
              ("pathprof_tps", "measured transactions per second", None, lambda s: s.tps, 1.0),
              ("pathprof_predicted_tps", "the model's TPS without the probes", None,
               lambda s: s.predicted_tps, 1.0),
              ("pathprof_probe_cost_per_transaction_seconds", "the probes' own run time per transaction", "seconds",
               lambda s: s.probe_cost_ns_per_txn, 1e-9)]
    for name, help_text, unit, get, factor in scalar:
        values = [(lb, _num(get(s))) for lb, s in runs]
        if any(v is not None for _, v in values):
            doc.family(name, "gauge", help_text, unit)
            for lb, v in values:
                if v is not None:
                    doc.sample(name, lb, v * factor)
    _latency(doc, runs)
    _per_txn(doc, runs)
    _closure(doc, runs)
    if histograms:
        _histograms(doc, runs, histograms)
    return doc.text()


def _run_labels(s: Summary) -> dict:
    run = s.run_id or (str(s.run_dir or "").rstrip("/").rsplit("/", 1)[-1]) or "live"
    return {"run": run, "topology": s.topology or "unknown"}


def _latency(doc: _Doc, runs) -> None:
    rows = [(lb, k, _num(getattr(s.latency_ms, k))) for lb, s in runs for k in ("mean", "p50", "p95", "p99")]
    rows = [r for r in rows if r[2] is not None]
    if rows:
        doc.family("pathprof_latency_seconds", "gauge", "the client's transaction latency", "seconds")
        for lb, k, v in rows:
            doc.sample("pathprof_latency_seconds", {**lb, "stat": k}, v / 1e3)


def _per_txn(doc: _Doc, runs) -> None:
    stage_rows, cpu_rows = [], []
    for lb, s in runs:
        merged: dict[tuple, float] = {}
        for st in s.stages:
            if st.parent:
                continue        # USDT parts of backend.execute: inside it, not added again
            key = (str(st.name), str(st.leg or ""))
            merged[key] = merged.get(key, 0.0) + (_num(st.us_per_txn) or 0.0)
        stage_rows += [(lb, k, v) for k, v in merged.items()]
        cpu_rows += [(lb, str(c.component), _num(c.us_per_txn) or 0.0) for c in s.cpu]
    if stage_rows:
        doc.family("pathprof_stage_per_transaction_seconds", "gauge",
                   "latency view: mean time per transaction in each stage of each leg", "seconds")
        for lb, (name, leg), v in stage_rows:
            doc.sample("pathprof_stage_per_transaction_seconds", {**lb, "stage": name, "leg": leg}, v / 1e6)
    if cpu_rows:
        doc.family("pathprof_cpu_per_transaction_seconds", "gauge",
                   "CPU view: CPU time per transaction of each component", "seconds")
        for lb, comp, v in cpu_rows:
            doc.sample("pathprof_cpu_per_transaction_seconds", {**lb, "component": comp}, v / 1e6)


def _closure(doc: _Doc, runs) -> None:
    rows = [(lb, view, _num(value)) for lb, s in runs
            for view, value in (("latency", s.closure.latency_error_pct), ("cpu", s.closure.cpu_error_pct))]
    rows = [r for r in rows if r[2] is not None]
    if rows:
        doc.family("pathprof_closure_error_ratio", "gauge",
                   "how far the sum of a view is from what was measured: (sum - measured) / measured", "ratio")
        for lb, view, v in rows:
            doc.sample("pathprof_closure_error_ratio", {**lb, "view": view}, v / 100.0)
    steal = [(lb, _num((s.doc.get("steal") or {}).get("pct"))) for lb, s in runs]
    steal = [r for r in steal if r[1] is not None]
    if steal:
        doc.family("pathprof_steal_ratio", "gauge",
                   "share of the CPUs' time a hypervisor ran other work while they had work (steal)", "ratio")
        for lb, v in steal:
            doc.sample("pathprof_steal_ratio", lb, v / 100.0)


def stage_histograms(stages_frame, client: str = "pgbench") -> list[dict]:
    """Per (stage, leg): {name, leg, count, sum_ns, slots} merged from stages.parquet rows that carry a histogram;
    the client's stages named after `client` (analysis.client: run.json's, as the summary's stages are)."""
    from pathprof.analysis.histogram import merge
    from pathprof.analysis.stages import LAT_KINDS, USDT_NAMES, stage_name
    if stages_frame is None or not len(stages_frame) or "hist" not in stages_frame:
        return []
    df = stages_frame.fillna({"hop": "", "hook": "", "netns": "", "dev": "", "leg": "", "role": ""})
    acc: dict[tuple, dict] = {}
    for r in df.itertuples(index=False):
        if r.kind not in LAT_KINDS and r.kind not in USDT_NAMES:
            continue
        name = stage_name(r.kind, r.role, r.hop, r.hook, r.netns, r.dev, client)
        e = acc.setdefault((name, r.leg), {"name": name, "leg": r.leg, "count": 0, "sum_ns": 0, "hists": []})
        e["count"] += int(r.count)
        e["sum_ns"] += int(r.sum_ns)
        e["hists"].append(r.hist)
    out = []
    for e in acc.values():
        slots = merge(e.pop("hists"))
        if slots is not None and sum(slots):
            out.append({**e, "slots": slots})
    return out


def _histograms(doc: _Doc, runs, histograms: dict) -> None:
    rows = [(lb, h) for lb, _ in runs for h in histograms.get(lb["run"]) or []]
    if not rows:
        return
    name = "pathprof_stage_duration_seconds"
    doc.family(name, "histogram", "duration of one occurrence of a stage, one bucket per power of two of the "
               "probes' log-linear histogram (wire.* include the netfilter and device time inside them)", "seconds")
    for lb, h in rows:
        labels = {**lb, "stage": h["name"], "leg": h["leg"]}
        slots = [int(x) for x in h["slots"]]
        nz = [i for i, c in enumerate(slots) if c]
        cum = 0
        # one bucket per power of two (the probes' slots split each into 4), from the first non-empty octave
        # to the last: cumulative counts at a subset of the slot bounds are exact
        last = nz[-1] | 3
        for i in range(nz[0], last + 1):
            cum += slots[i] if i < len(slots) else 0
            if i % 4 == 3 or i == len(slots) - 1:
                doc.sample(f"{name}_bucket", {**labels, "le": _le(slot_bounds(i)[1] / 1e9)}, cum)
        doc.sample(f"{name}_bucket", {**labels, "le": "+Inf"}, cum)
        doc.sample(f"{name}_count", labels, cum)
        doc.sample(f"{name}_sum", labels, h["sum_ns"] / 1e9)


def _le(x: float) -> str:
    return repr(float(x))
