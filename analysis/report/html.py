"""A self-contained HTML report: inline CSS and a little inline JS (sortable tables), the path diagram (inline
SVG, analysis.report.svg_path) first, then explanation sentences, the closure/probe-cost caveats where a reader cannot
miss them, figures as base64 PNG (also written next to the HTML; analysis.report.charts), waterfalls of sampled
transactions (analysis.report.waterfall) and the per-run tables. Nothing is fetched from anywhere: the report is one
file.
"""
from __future__ import annotations

import base64
import html
from pathlib import Path

from pathprof import __version__
from pathprof.analysis.explain import _num, cpu_totals, explain_text, measured_cpu_us, run_label
from pathprof.analysis.report import charts
from pathprof.analysis.report.compare_view import own_share
from pathprof.analysis.report.palette import hops_of, qdisc_aware_cause
from pathprof.analysis.report.parts import CSS, SCRIPT, cause_legend, diagrams, waterfalls
from pathprof.analysis.report.render import CLOSURE_WARN_PCT, LEG_ORDER
from pathprof.analysis.run_model import Stage, Summary
from pathprof.analysis.sweep import sweep_text


def _e(x) -> str:
    return html.escape(str(x))


def _checks(summaries: list[Summary]) -> str:
    """Closure and probe cost per run, in one block near the top: a figure that does not add up, or probes that
    cost a visible share of a transaction, change how much a reader should trust everything below."""
    rows, bad = [], []
    for s in summaries:
        cells = [run_label(s)]
        for err, view in ((s.closure.latency_error_pct, "latency view"), (s.closure.cpu_error_pct, "CPU view")):
            if err is None:
                cells.append("not measured")
                bad.append(f"{run_label(s)}: the {view} closure was not measured, so its figures are not checked")
            else:
                cells.append(f"{_num(err):+.1f} %")
                if abs(_num(err)) > CLOSURE_WARN_PCT:
                    bad.append(f"{run_label(s)}: the {view} does not close ({_num(err):+.1f} %); treat its "
                               f"per-stage figures as approximate")
        cost = s.probe_cost_ns_per_txn
        mean_us = _num(s.latency_ms.mean) * 1000
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


def _runs_table(summaries: list[Summary], repeats: list[list[Summary]] | None = None) -> str:
    base_tps = _num(summaries[0].tps)
    rows = []
    for i, (label, s) in enumerate(zip(charts.labels(summaries), summaries)):
        tps = _num(s.tps)
        rows.append([label, f"{tps:,.0f}", "baseline" if i == 0 else
                     (f"{(tps - base_tps) / base_tps * 100:+.1f} %" if base_tps else "–"),
                     f"{_num(s.latency_ms.mean):.3f}", f"{_num(s.latency_ms.p99):.3f}", s.regime or "?",
                     f"{_num(s.predicted_tps):,.0f}" if s.predicted_tps is not None else "–"])
        if repeats:
            vals = [_num(r.tps) for r in repeats[i]] if i < len(repeats) else []
            rows[-1].append(f"{min(vals):,.0f} … {max(vals):,.0f} ({len(vals)} runs)" if len(vals) > 1 else "–")
    head = ["run", "TPS", "Δ TPS", "mean ms", "p99 ms", "regime", "predicted TPS"]
    return _table(head + (["TPS spread of the repeats"] if repeats else []), rows, sortable=True)


def _table(head: list[str], rows: list[list], total: list | None = None, sortable: bool = False) -> str:
    """A table; sortable ones sort by a click on a column head (inline script), the total row stays last."""
    h = "".join(f"<th>{_e(c)}</th>" for c in head)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in r) + "</tr>" for r in rows)
    foot = ('<tfoot><tr class="total">' + "".join(f"<td>{_e(c)}</td>" for c in total) + "</tr></tfoot>"
            if total else "")
    cls = ' class="sortable" title="click a column head to sort"' if sortable else ""
    return f"<table{cls}><thead><tr>{h}</tr></thead><tbody>{body}</tbody>{foot}</table>"


def _sum_label(s: Summary) -> str:
    cycle = s.closure.cycle_us
    if cycle:
        return f"sum of stages (measured cycle, clients ÷ TPS: {_num(cycle):,.1f})"
    return "sum of stages (measured mean " + f"{_num(s.latency_ms.mean) * 1000:,.1f})"


def _stage_row(st: Stage, hops: set[str], tot: float) -> list:
    return [st.leg if st.leg is not None else "", qdisc_aware_cause(str(st.name), hops), st.name,
            f"{_num(st.us_per_txn):,.1f}", f"{_num(st.p99_us):,.1f}" if st.p99_us is not None else "–",
            f"{_num(st.us_per_txn) / tot * 100:.1f} %" if tot else "–"]


def _pooler_lines(s: Summary) -> list[str]:
    """The pooler's own counters against its named wait, which backend served the sampled transactions, and a -C
    setup step on another divisor than the transactions: the report's lines, as paragraphs."""
    from pathprof.analysis.pooler import describe as pooler_line
    from pathprof.analysis.served import describe as served_line
    out = [f"<p>{_e(pooler_line(r))}</p>" for r in s.pooler_counters or []]
    if s.served_by:
        out.append(f"<p>{_e(served_line(s.served_by))}</p>")
    if s.closure.connect_divisors:
        out.append(f'<p class="caveat">{_e(s.closure.connect_divisors["statement"])}</p>')
    return out


def _run_section(s: dict | Summary) -> str:
    s = Summary.of(s)
    lat = s.latency_ms
    parts = [f"<h2>{_e(run_label(s))} — {_e(s.clients)} clients</h2>",
             f"<p>{_num(s.tps):,.0f} TPS measured"
             + (f", {_num(s.predicted_tps):,.0f} predicted" if s.predicted_tps is not None else "")
             + f"; regime <b>{_e(s.regime or 'unknown')}</b>; latency "
             + ", ".join(f"{k} {_num(getattr(lat, k)):.3f} ms" for k in ("mean", "p50", "p95", "p99") if k in lat.doc)
             + "</p>"]
    stages = [st for st in s.stages if not st.parent]
    tot = sum(_num(st.us_per_txn) for st in stages)
    rank = {leg: i for i, leg in enumerate(LEG_ORDER)}
    hops = hops_of([s])
    rows = [_stage_row(st, hops, tot) for st in sorted(stages, key=lambda st: rank.get(st.leg, len(rank)))]
    if rows:
        parts.append("<h3>Latency view (µs per transaction)</h3>" + _table(
            ["leg", "cause", "stage", "µs/txn", "p99 µs", "share"], rows,
            ["", "", _sum_label(s), f"{tot:,.1f}", "", ""], sortable=True))
    parts_ = [st for st in s.stages if st.parent]
    if parts_:
        title = ("Inside backend.execute: exclusive parts that add up to it, and · phases that overlap them"
                 if any(st.part for st in parts_) else
                 "Inside backend.execute (PostgreSQL USDT, not added again)")
        parts.append(f"<h4>{title}</h4>" + _table(
            ["part", "µs/txn", "p99 µs"], [[("· " if st.phase else "") + str(st.name),
                                           f"{_num(st.us_per_txn):,.1f}",
                                           f"{_num(st.p99_us):,.1f}" if st.p99_us is not None
                                           else "–"] for st in parts_], sortable=True))
    cpu = sorted(cpu_totals(s).items(), key=lambda kv: -kv[1])
    if cpu:
        ctot = sum(v for _, v in cpu)
        parts.append("<h3>CPU view (CPU µs per transaction)</h3>" + _table(
            ["component", "cause", "µs/txn", "share"],
            [[n, qdisc_aware_cause(n, hops), f"{v:,.1f}", f"{v / ctot * 100:.1f} %"] for n, v in cpu],
            [f"sum of components (measured {measured_cpu_us(s):,.1f})", "", f"{ctot:,.1f}", ""], sortable=True))
    conn = s.connection_setup
    if conn:
        parts.append("<h3>Connection setup (µs per connection)</h3>" + _table(
            ["step", "µs/conn"], [[c.name, f"{_num(c.us_per_conn):,.1f}"] for c in conn],
            ["total", f"{sum(_num(c.us_per_conn) for c in conn):,.1f}"]))
    parts += _pooler_lines(s)
    notes = s.notes
    if notes:
        notes = [notes] if isinstance(notes, str) else notes
        parts.append("<ul>" + "".join(f"<li>{_e(n)}</li>" for n in notes) + "</ul>")
    host = s.host
    facts = [f"{k} {v}" for k, v in (("hostname", host.hostname), ("kernel", host.kernel), ("cpus", host.cpus)) if v]
    facts += [f"accelerator {s.accelerator}"] if s.accelerator else []
    facts += [f"run directory {s.run_dir}"] if s.run_dir else []
    if facts:
        parts.append(f'<p class="muted">{_e(", ".join(facts))}</p>')
    return "\n".join(parts)


def write_html(summaries: list[dict | Summary], path: Path, explanations=None, sweep=None,
               latency_samples: dict[str, list[float]] | None = None,
               repeats: list[list[dict | Summary]] | None = None) -> Path:
    """Write the report to `path` and its figures to `<stem>-<figure>.png` beside it; return `path`.
    repeats: with `compare --repeat`, every run of each entry (aligned with `summaries`, which hold the median
    runs), for the spread in the throughput chart and the runs table. Runs are read through the typed run model
    (analysis.run_model.Summary) from here down."""
    summaries = [Summary.of(s) for s in summaries]
    repeats = [[Summary.of(r) for r in rs] for rs in repeats] if repeats is not None else None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    runs_color = charts.RunColors()
    figures = [
        ("stages", "Where the time goes: latency by leg and cause", charts.stages_figure(summaries)),
        ("cpu", "Where the CPU goes: CPU by cause", charts.cpu_figure(summaries)),
        ("latency-cdf", "Latency distribution", charts.cdf_figure(latency_samples or {}, runs_color)),
        ("tps", "Throughput, measured and predicted", charts.tps_figure(summaries, runs_color, repeats)),
        ("sweep", "Throughput and latency against clients", charts.sweep_figure(sweep)),
    ]
    imgs = _figure_sections(figures, path, summaries)
    lead = _lead(summaries, explanations, sweep)
    expl_tables = [_explanation_table(e) for e in explanations or []]
    title = "pathprof report — " + ", ".join(dict.fromkeys(run_label(s) for s in summaries))
    doc = "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_e(title)}</title><style>{CSS}</style>",
        # before anything else runs: a script error marks the page, so a test (or a reader) sees it
        "<script>window.addEventListener('error',function(e){document.documentElement.setAttribute("
        "'data-js-error',String(e.message))});</script></head><body>",
        f"<h1>{_e(title)}</h1>",
        *(f'<p class="lead">{_e(t)}</p>' for t in lead),
        diagrams(summaries, charts.labels(summaries)),
        _checks(summaries) if summaries else "",
        _runs_table(summaries, repeats) if len(summaries) > 1 else "",
        *expl_tables, *imgs, waterfalls(summaries, charts.labels(summaries)),
        *(_run_section(s) for s in summaries),
        f'<p class="muted">Generated by pathprof {_e(__version__)} from the run directories alone.</p>',
        f"<script>{SCRIPT}</script>", "</body></html>"])
    path.write_text(doc, encoding="utf-8")
    return path


def _figure_sections(figures: list, path: Path, summaries: list[Summary]) -> list[str]:
    """Each figure as a PNG beside the report and inline in it, the causes' legend after the first."""
    imgs = []
    for name, caption, fig in figures:
        if fig is None:
            continue
        png = charts.png(fig)
        (path.parent / f"{path.stem}-{name}.png").write_bytes(png)
        imgs.append(f"<h2>{_e(caption)}</h2><img alt=\"{_e(caption)}\" "
                    f"src=\"data:image/png;base64,{base64.b64encode(png).decode('ascii')}\">")
    if imgs:
        imgs.insert(1, cause_legend(summaries))
    return imgs


def _lead(summaries: list[Summary], explanations, sweep) -> list[str]:
    """The report's first sentences: each explanation, the sweep, else the first run's headline."""
    lead = [explain_text(e) for e in explanations or []]
    if sweep:
        lead.append(sweep_text(sweep))
    if not lead and summaries:
        s = summaries[0]
        biggest = max(s.stages or [Stage()], key=lambda st: _num(st.us_per_txn))
        lead.append(f"{run_label(s)}: {_num(s.tps):,.0f} TPS, {s.regime or 'regime unknown'}"
                    + (f"; the largest stage is {biggest.name} ({_num(biggest.us_per_txn):,.1f} µs per "
                       f"transaction)" if biggest.name else ""))
    return lead


def _explanation_table(e: dict) -> str:
    """One explanation: each cause, then the items that moved under it, and what is left unexplained."""
    unit = "CPU µs/txn" if e.get("basis") == "cpu" else "µs/txn"
    # an item's own part under its cause: its delta less what a common speed factor took of it (speed.py)
    delta = {it["name"]: _num(it["delta_us_per_txn"]) - _num(it.get("speed_us_per_txn")) for it in e.get("items") or []}
    share = {it["name"]: own_share(it, e) for it in e.get("items") or []}

    def pct(x):
        return "–" if x is None else f"{_num(x):.1f} %"
    rows = []
    for c in e.get("causes") or []:
        if abs(_num(c.get("delta_us_per_txn"))) < 0.05:
            continue
        rows.append([f"{c['name']}", f"{_num(c['delta_us_per_txn']):+,.1f}", pct(c.get("share_pct"))])
        if c.get("ratio") is not None:        # the common speed factor: its ratio, not its many items again
            rows.append([f"\u2003× {_num(c['ratio']):.2f} (interquartile {_num(c['low']):.2f}–"
                         f"{_num(c['high']):.2f}) over {c.get('stages_n')} stages", "", ""])
            continue
        rows += [[f"\u2003{n}", f"{delta[n]:+,.1f}", pct(share.get(n))]
                 for n in sorted(c.get("items") or [], key=lambda n: -abs(delta.get(n, 0.0)))
                 if abs(delta.get(n, 0.0)) >= 0.05]
    total = (["unexplained", "", f"{_num(e.get('unexplained_pct')):.1f} %"]
             if e.get("unexplained_pct") is not None else None)
    return (f"<h3>{_e(e.get('run'))} vs {_e(e.get('baseline', 'baseline'))} "
            f"({'CPU' if e.get('basis') == 'cpu' else 'latency'} view)</h3>"
            + (f"<p class=\"note\">basis: {_e(e['basis_reason'])}</p>" if e.get("basis_reason") else "")
            + _table(["cause / item", f"Δ {unit}", "share of gap"], rows, total))
