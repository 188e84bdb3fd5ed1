"""A self-contained HTML report: inline CSS, figures as base64 PNG (also written next to the HTML), explanation
sentences first, and the closure/probe-cost caveats where a reader cannot miss them.

Figures are drawn on `matplotlib.figure.Figure` objects directly (Agg canvas, no pyplot), so nothing here touches
global backend state and the CLI can call it from any thread. PNGs carry no timestamp metadata, so the same run
directory gives byte-identical files.
"""
from __future__ import annotations

import base64
import html
import io
from pathlib import Path

from matplotlib.figure import Figure
from pathprof import __version__
from pathprof.analysis.explain import (
    _distinct_label,
    _num,
    connection_totals,
    cpu_totals,
    explain_text,
    has_execute_parts,
    measured_cpu_us,
    run_label,
)
from pathprof.analysis.render import CLOSURE_WARN_PCT, LEG_ORDER
from pathprof.analysis.sweep import sweep_text

_PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f",
            "#bab0ac", "#2f4b7c", "#bcbd22", "#17becf", "#8c1d40", "#ffbe7d", "#8cd17d", "#6b6b6b", "#d4a6c8"]
_CSS = """
body{font:15px/1.45 system-ui,-apple-system,Segoe UI,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;
color:#222}
h1{font-size:1.6em;margin-bottom:.2em}h2{margin-top:1.8em;border-bottom:1px solid #ddd;padding-bottom:.2em}
.lead{font-size:1.15em;background:#f3f7fb;border-left:4px solid #4e79a7;padding:.6em 1em;margin:.5em 0}
.caveat{background:#fff8e5;border-left:4px solid #edc948;padding:.5em 1em;margin:.4em 0}
.ok{background:#eef8ee;border-left:4px solid #59a14f;padding:.5em 1em;margin:.4em 0}
table{border-collapse:collapse;margin:.6em 0;font-variant-numeric:tabular-nums}
th,td{padding:.25em .7em;border-bottom:1px solid #eee;text-align:right}th{background:#fafafa}
td:first-child,th:first-child,td.l{text-align:left}tr.total td{font-weight:600;border-top:2px solid #ccc}
img{max-width:100%;height:auto;margin:.5em 0}.muted{color:#777;font-size:.9em}
"""


class _Palette:
    """Colours handed out in order of first use, one palette per report: the same stage or component keeps its
    colour across every figure of a report, and neighbours never share one (a hash of the name collided)."""

    def __init__(self) -> None:
        self.assigned: dict[str, str] = {}

    def __call__(self, name: str) -> str:
        if name not in self.assigned:
            self.assigned[name] = _PALETTE[len(self.assigned) % len(_PALETTE)]
        return self.assigned[name]


def _labels(summaries: list[dict]) -> list[str]:
    """Distinct axis labels: a sweep or repeats share a topology, and matplotlib would stack same-named bars."""
    labels = [run_label(s) for s in summaries]
    if len(set(labels)) < len(labels):
        if len({s.get("clients") for s in summaries}) == len(summaries):       # a sweep
            labels = [f"{lb} ({s.get('clients', '?')} cl.)" for lb, s in zip(labels, summaries)]
        else:                                                                    # e.g. -C against long connections
            labels = labels[:1] + [_distinct_label(summaries[0], s) for s in summaries[1:]]
    if len(set(labels)) < len(labels):
        labels = [f"{lb} #{i + 1}" for i, lb in enumerate(labels)]
    return labels


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})
    return buf.getvalue()


def _stacked(summaries: list[dict], totals_of, title: str, xlabel: str, color: _Palette) -> Figure | None:
    """One horizontal bar per run, one segment per stage/component, legend by name."""
    per_run = [totals_of(s) for s in summaries]
    names = list(dict.fromkeys(n for t in per_run for n in t))
    if not names:
        return None
    fig = Figure(figsize=(9, 1.2 + 0.55 * len(summaries)))
    ax = fig.add_subplot()
    labels = _labels(summaries)
    left = [0.0] * len(summaries)
    for name in names:
        vals = [t.get(name, 0.0) for t in per_run]
        ax.barh(labels, vals, left=left, color=color(name), label=name, edgecolor="white", linewidth=0.5)
        left = [a + b for a, b in zip(left, vals)]
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title, loc="left")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    return fig


def _ordered_stage_totals(s: dict) -> dict[str, float]:
    """Stage totals in leg order (request, server, response), so stacked segments read left to right as the path."""
    out: dict[str, float] = {}
    stages = s.get("stages") or []
    rank = {leg: i for i, leg in enumerate(LEG_ORDER)}
    split = has_execute_parts(s)      # deep: backend.execute's exclusive parts stack in its place
    for st in sorted(stages, key=lambda st: rank.get(st.get("leg"), len(rank))):
        if (st.get("parent") and not (split and st.get("part"))) or (split and st.get("name") == "backend.execute"):
            continue                  # a stage's phases or parts are inside it: never stacked on top of it
        out[str(st.get("name"))] = out.get(str(st.get("name")), 0.0) + _num(st.get("us_per_txn"))
    # Under -C every transaction also pays a connection setup; without it the bars would hide what -C costs.
    return {**out, **connection_totals(s)}


def _cdf(samples: dict[str, list[float]], color: _Palette) -> Figure | None:
    # Log scale: a non-positive latency (pgbench's markers for skipped transactions) cannot be placed, so drop it.
    samples = {k: sorted(float(x) for x in v if x is not None and x > 0) for k, v in (samples or {}).items()}
    samples = {k: v for k, v in samples.items() if v}
    if not samples:
        return None
    fig = Figure(figsize=(9, 4))
    ax = fig.add_subplot()
    for label, xs in samples.items():
        n = len(xs)
        ax.step(xs, [(i + 1) / n for i in range(n)], where="post", label=f"{label} (n={n:,})", color=color(label))
    ax.set_xscale("log")
    ax.set_xlabel("transaction latency (ms, log scale)")
    ax.set_ylabel("fraction of transactions")
    for q in (0.5, 0.99):
        ax.axhline(q, color="#bbb", linewidth=0.7, linestyle="--")
    ax.set_title("Latency CDF", loc="left")
    ax.legend(fontsize=8, frameon=False)
    return fig


def _tps_bars(summaries: list[dict], color: _Palette) -> Figure | None:
    if len(summaries) < 2:
        return None
    fig = Figure(figsize=(9, 3.5))
    ax = fig.add_subplot()
    labels = _labels(summaries)
    ax.bar(labels, [_num(s.get("tps")) for s in summaries], color=[color(run_label(s)) for s in summaries],
           label="measured")
    pred = [s.get("predicted_tps") for s in summaries]
    if any(p is not None for p in pred):
        ax.scatter(labels, [_num(p, default=float("nan")) for p in pred], marker="_", s=600, color="black",
                   label="predicted by the model", zorder=3)
    ax.set_ylabel("TPS")
    ax.set_title("Throughput", loc="left")
    ax.legend(fontsize=8, frameon=False)
    ax.tick_params(axis="x", labelrotation=20)
    return fig


def _sweep_fig(sweep: dict) -> Figure | None:
    pts = (sweep or {}).get("points") or []
    if len(pts) < 2:
        return None
    fig = Figure(figsize=(9, 4))
    ax = fig.add_subplot()
    xs = [p["clients"] for p in pts]
    ax.plot(xs, [p["tps"] for p in pts], marker="o", color="#4e79a7", label="TPS")
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel("clients")
    ax.set_ylabel("TPS")
    ax2 = ax.twinx()
    ax2.plot(xs, [_num((p.get("latency_ms") or {}).get("mean")) for p in pts], marker="s", color="#e15759",
             label="mean latency (ms)")
    ax2.set_ylabel("mean latency (ms)")
    lines = ax.get_lines() + ax2.get_lines()
    ax.legend(lines, [ln.get_label() for ln in lines], loc="upper left", fontsize=8, frameon=False)
    if sweep.get("knee_clients") is not None:
        ax.axvline(sweep["knee_clients"], color="#999", linestyle="--", linewidth=1)
        ax.annotate("knee", (sweep["knee_clients"], ax.get_ylim()[1]), ha="left", va="top", fontsize=9)
    ax.set_title(f"Sweep: {sweep.get('topology')}", loc="left")
    return fig


def _e(x) -> str:
    return html.escape(str(x))


def _checks(summaries: list[dict]) -> str:
    """Closure and probe cost per run, in one block near the top: a figure that does not add up, or probes that
    cost a visible share of a transaction, change how much a reader should trust everything below."""
    rows, bad = [], []
    for s in summaries:
        closure = s.get("closure") or {}
        cells = [run_label(s)]
        for key, view in (("latency_error_pct", "latency view"), ("cpu_error_pct", "CPU view")):
            err = closure.get(key)
            if err is None:
                cells.append("not measured")
                bad.append(f"{run_label(s)}: the {view} closure was not measured, so its figures are not checked")
            else:
                cells.append(f"{_num(err):+.1f} %")
                if abs(_num(err)) > CLOSURE_WARN_PCT:
                    bad.append(f"{run_label(s)}: the {view} does not close ({_num(err):+.1f} %); treat its "
                               f"per-stage figures as approximate")
        cost = s.get("probe_cost_ns_per_txn")
        mean_us = _num((s.get("latency_ms") or {}).get("mean")) * 1000
        if cost is None:
            cells.append("not measured")
            bad.append(f"{run_label(s)}: the probes' own cost was not measured")
        else:
            cells.append(f"{_num(cost):,.0f} ns" + (f" ({_num(cost) / 10 / mean_us:.2f} % of latency)"
                                                     if mean_us else ""))
        rows.append(cells)
    msg = ("".join(f"<div>{_e(b)}.</div>" for b in bad) if bad else
           "<div>Both views add up to what was measured, within "
           f"{CLOSURE_WARN_PCT:g} %, for every run; the probes' own cost is the CPU component `probes`, and "
           "the predicted TPS is the model's without them.</div>")
    return (f'<div class="{"caveat" if bad else "ok"}">{msg}'
            + _table(["run", "latency closure", "CPU closure", "probe cost per txn"], rows) + "</div>")


def _runs_table(summaries: list[dict]) -> str:
    base_tps = _num(summaries[0].get("tps"))
    rows = []
    for i, (label, s) in enumerate(zip(_labels(summaries), summaries)):
        lat = s.get("latency_ms") or {}
        tps = _num(s.get("tps"))
        rows.append([label, f"{tps:,.0f}", "baseline" if i == 0 else
                     (f"{(tps - base_tps) / base_tps * 100:+.1f} %" if base_tps else "–"),
                     f"{_num(lat.get('mean')):.3f}", f"{_num(lat.get('p99')):.3f}", s.get("regime") or "?",
                     f"{_num(s['predicted_tps']):,.0f}" if s.get("predicted_tps") is not None else "–"])
    return _table(["run", "TPS", "Δ TPS", "mean ms", "p99 ms", "regime", "predicted TPS"], rows)


def _table(head: list[str], rows: list[list], total: list | None = None) -> str:
    h = "".join(f"<th>{_e(c)}</th>" for c in head)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in r) + "</tr>" for r in rows)
    if total:
        body += '<tr class="total">' + "".join(f"<td>{_e(c)}</td>" for c in total) + "</tr>"
    return f"<table><tr>{h}</tr>{body}</table>"


def _sum_label(s: dict, lat: dict) -> str:
    cycle = (s.get("closure") or {}).get("cycle_us")
    if cycle:
        return f"sum of stages (measured cycle, clients ÷ TPS: {_num(cycle):,.1f})"
    return "sum of stages (measured mean " + f"{_num(lat.get('mean')) * 1000:,.1f})"


def _run_section(s: dict) -> str:
    lat = s.get("latency_ms") or {}
    parts = [f"<h2>{_e(run_label(s))} — {_e(s.get('clients', '?'))} clients</h2>",
             f"<p>{_num(s.get('tps')):,.0f} TPS measured"
             + (f", {_num(s['predicted_tps']):,.0f} predicted" if s.get("predicted_tps") is not None else "")
             + f"; regime <b>{_e(s.get('regime') or 'unknown')}</b>; latency "
             + ", ".join(f"{k} {_num(lat.get(k)):.3f} ms" for k in ("mean", "p50", "p95", "p99") if k in lat)
             + "</p>"]
    stages = s.get("stages") or []
    tot = sum(_num(st.get("us_per_txn")) for st in stages)
    rank = {leg: i for i, leg in enumerate(LEG_ORDER)}
    rows = [[st.get("leg", ""), st.get("name"), f"{_num(st.get('us_per_txn')):,.1f}",
             f"{_num(st.get('p99_us')):,.1f}" if st.get("p99_us") is not None else "–",
             f"{_num(st.get('us_per_txn')) / tot * 100:.1f} %" if tot else "–"]
            for st in sorted(stages, key=lambda st: rank.get(st.get("leg"), len(rank)))]
    if rows:
        parts.append("<h3>Latency view (µs per transaction)</h3>" + _table(
            ["leg", "stage", "µs/txn", "p99 µs", "share"], rows,
            ["", _sum_label(s, lat), f"{tot:,.1f}", "", ""]))
    cpu = sorted(cpu_totals(s).items(), key=lambda kv: -kv[1])
    if cpu:
        ctot = sum(v for _, v in cpu)
        parts.append("<h3>CPU view (CPU µs per transaction)</h3>" + _table(
            ["component", "µs/txn", "share"], [[n, f"{v:,.1f}", f"{v / ctot * 100:.1f} %"] for n, v in cpu],
            [f"sum of components (measured {measured_cpu_us(s):,.1f})", f"{ctot:,.1f}", ""]))
    conn = s.get("connection_setup") or []
    if conn:
        parts.append("<h3>Connection setup (µs per connection)</h3>" + _table(
            ["step", "µs/conn"], [[c.get("name"), f"{_num(c.get('us_per_conn')):,.1f}"] for c in conn],
            ["total", f"{sum(_num(c.get('us_per_conn')) for c in conn):,.1f}"]))
    notes = s.get("notes")
    if notes:
        notes = [notes] if isinstance(notes, str) else notes
        parts.append("<ul>" + "".join(f"<li>{_e(n)}</li>" for n in notes) + "</ul>")
    host = s.get("host") or {}
    facts = [f"{k} {host[k]}" for k in ("hostname", "kernel", "cpus") if host.get(k)]
    facts += [f"accelerator {s['accelerator']}"] if s.get("accelerator") else []
    facts += [f"run directory {s['run_dir']}"] if s.get("run_dir") else []
    if facts:
        parts.append(f'<p class="muted">{_e(", ".join(facts))}</p>')
    return "\n".join(parts)


def write_html(summaries: list[dict], path: Path, explanations=None, sweep=None,
               latency_samples: dict[str, list[float]] | None = None) -> Path:
    """Write the report to `path` and its figures to `<stem>-<figure>.png` beside it; return `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    runs_color, parts_color = _Palette(), _Palette()   # runs and stages/components are different kinds of thing
    figures = [
        ("stages", "Where the time goes: latency per stage", _stacked(
            summaries, _ordered_stage_totals, "Latency per transaction by stage", "µs per transaction", parts_color)),
        ("cpu", "Where the CPU goes: CPU per component", _stacked(
            summaries, cpu_totals, "CPU per transaction by component", "CPU µs per transaction", parts_color)),
        ("latency-cdf", "Latency distribution", _cdf(latency_samples or {}, runs_color)),
        ("tps", "Throughput, measured and predicted", _tps_bars(summaries, runs_color)),
        ("sweep", "Throughput and latency against clients", _sweep_fig(sweep)),
    ]
    imgs = []
    for name, caption, fig in figures:
        if fig is None:
            continue
        png = _png(fig)
        (path.parent / f"{path.stem}-{name}.png").write_bytes(png)
        imgs.append(f"<h2>{_e(caption)}</h2><img alt=\"{_e(caption)}\" "
                    f"src=\"data:image/png;base64,{base64.b64encode(png).decode('ascii')}\">")

    lead = [explain_text(e) for e in explanations or []]
    if sweep:
        lead.append(sweep_text(sweep))
    if not lead and summaries:
        s = summaries[0]
        biggest = max(s.get("stages") or [{}], key=lambda st: _num(st.get("us_per_txn")))
        lead.append(f"{run_label(s)}: {_num(s.get('tps')):,.0f} TPS, {s.get('regime') or 'regime unknown'}"
                    + (f"; the largest stage is {biggest['name']} ({_num(biggest.get('us_per_txn')):,.1f} µs per "
                       f"transaction)" if biggest.get("name") else ""))
    expl_tables = []
    for e in explanations or []:
        unit = "CPU µs/txn" if e.get("basis") == "cpu" else "µs/txn"
        delta = {it["name"]: _num(it["delta_us_per_txn"]) for it in e.get("items") or []}
        share = {it["name"]: it.get("share_pct") for it in e.get("items") or []}

        def pct(x):
            return "–" if x is None else f"{_num(x):.1f} %"
        rows = []
        for c in e.get("causes") or []:   # each cause, then the items that moved under it
            if abs(_num(c.get("delta_us_per_txn"))) < 0.05:
                continue
            rows.append([f"{c['name']}", f"{_num(c['delta_us_per_txn']):+,.1f}", pct(c.get("share_pct"))])
            rows += [[f"\u2003{n}", f"{delta[n]:+,.1f}", pct(share.get(n))]
                     for n in sorted(c.get("items") or [], key=lambda n: -abs(delta.get(n, 0.0)))
                     if abs(delta.get(n, 0.0)) >= 0.05]
        total = (["unexplained", "", f"{_num(e.get('unexplained_pct')):.1f} %"]
                 if e.get("unexplained_pct") is not None else None)
        expl_tables.append(f"<h3>{_e(e.get('run'))} vs {_e(e.get('baseline', 'baseline'))} "
                           f"({'CPU' if e.get('basis') == 'cpu' else 'latency'} view)</h3>"
                           + (f"<p class=\"note\">basis: {_e(e['basis_reason'])}</p>" if e.get("basis_reason") else "")
                           + _table(["cause / item", f"Δ {unit}", "share of gap"], rows, total))
    title = "pathprof report — " + ", ".join(dict.fromkeys(run_label(s) for s in summaries))
    doc = "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{_e(title)}</h1>",
        *(f'<p class="lead">{_e(t)}</p>' for t in lead),
        _checks(summaries) if summaries else "",
        _runs_table(summaries) if len(summaries) > 1 else "",
        *expl_tables, *imgs, *(_run_section(s) for s in summaries),
        f'<p class="muted">Generated by pathprof {_e(__version__)} from the run directories alone.</p>',
        "</body></html>"])
    path.write_text(doc, encoding="utf-8")
    return path
