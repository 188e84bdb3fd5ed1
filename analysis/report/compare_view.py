"""The terminal views over several runs: compare (runs side by side and each one's explanation against the
baseline), predictions, sweep and diff. Runs are read through the typed run model (analysis.run_model.Summary;
summary dicts are read through it); explanations, predictions and sweeps are their own documents (dicts)."""
from __future__ import annotations

from pathlib import Path

from pathprof.analysis.explain import _distinct_label, _num, cpu_totals, explain_text, run_label, stage_totals
from pathprof.analysis.report.text import _fmt, bar
from pathprof.analysis.run_model import Summary
from pathprof.analysis.speed import speed_phrase
from pathprof.analysis.sweep import sweep_text
from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text


def _top_stages(summary: Summary, n: int = 3) -> str:
    totals = sorted(stage_totals(summary).items(), key=lambda kv: -kv[1])[:n]
    return "\n".join(f"{name} {us:,.0f}" for name, us in totals)     # one per line: wrapping splits pairs


def _compare_table(summaries: list[dict | Summary], spreads: dict | None = None) -> Table:
    summaries = [Summary.of(s) for s in summaries]
    base = summaries[0]
    base_tps = _num(base.tps)
    t = Table(title="Runs (first is the baseline)", title_justify="left", show_edge=False)
    cols = [("run", {}), ("TPS", {"justify": "right"}), ("Δ TPS", {"justify": "right"})]
    cols += [("spread", {"justify": "right"})] if spreads else []
    cols += [("mean ms", {"justify": "right"}), ("p99 ms", {"justify": "right"}), ("regime", {}),
             ("predicted", {"justify": "right"}), ("top stages (µs/txn)", {})]
    for col, kw in cols:
        t.add_column(col, **kw)
    for i, s in enumerate(summaries):
        label = run_label(s) if i == 0 else _distinct_label(base, s)
        tps = _num(s.tps)
        row = [label, _fmt(tps, ",.0f"), "baseline" if i == 0 else
               (f"{(tps - base_tps) / base_tps * 100:+.1f} %" if base_tps else "–")]
        if spreads:
            sp = spreads.get(label) or spreads.get(run_label(s))
            row.append(f"±{sp['stdev']:,.0f} ({sp['min']:,.0f}–{sp['max']:,.0f}, n={sp['n']})" if sp else "")
        row += [_fmt(s.latency_ms.mean, ".3f"), _fmt(s.latency_ms.p99, ".3f"), str(s.regime or "?"),
                _fmt(s.predicted_tps, ",.0f"), _top_stages(s)]
        t.add_row(*row)
    return t


def _share_text(share) -> str:
    return "–" if share is None else f"{_num(share):.1f} %"


def own_share(item: dict, expl: dict):
    """An item's share of the gap under its cause: of its own part when a common speed factor took the rest."""
    if item.get("speed_us_per_txn") is None or item.get("share_pct") is None or not expl.get("gap_us_per_txn"):
        return item.get("share_pct")
    own = _num(item.get("delta_us_per_txn")) - _num(item["speed_us_per_txn"])
    return round(own / _num(expl["gap_us_per_txn"]) * 100.0, 1)


def explanation_view(expl: dict, max_items: int = 8):
    """The sentence, then the causes ranked by share of the measured gap with the items that moved under each,
    then the remainder. An unranked gap (within noise, smaller than its parts) lists the moves by size, no shares."""
    unit = "CPU µs/txn" if expl.get("basis") == "cpu" else "µs/txn"
    t = Table(show_edge=False, box=None, padding=(0, 2))
    for col, kw in (("", {}), (f"Δ {unit}", {"justify": "right"}), ("share", {"justify": "right"}),
                    ("", {"no_wrap": True})):
        t.add_column(col, **kw)
    # under each cause, an item's own part: its delta less what a common speed factor took of it (speed.py)
    delta = {it["name"]: _num(it.get("delta_us_per_txn")) - _num(it.get("speed_us_per_txn"))
             for it in expl.get("items") or []}
    share = {it["name"]: own_share(it, expl) for it in expl.get("items") or []}
    causes = [c for c in expl.get("causes") or [] if abs(_num(c.get("delta_us_per_txn"))) >= 0.05]
    top = max((abs(_num(c.get("share_pct"))) for c in causes), default=0.0)
    shown = 0
    for c in causes:
        cs = c.get("share_pct")
        name = str(c.get("name"))
        if c.get("uncertain"):        # --repeat: its move changed sign between repeats
            name += f" (repeats: {_num(c['spread']['min']):+,.1f} … {_num(c['spread']['max']):+,.1f}, may be noise)"
        t.add_row(Text(name, style="bold"), f"{_num(c.get('delta_us_per_txn')):+,.1f}", _share_text(cs),
                  Text(bar(abs(_num(cs)), top, 20), style="green" if _num(cs) >= 0 else "red") if cs is not None
                  else "")
        if c.get("ratio") is not None:       # the common speed factor: one line, not its many items again
            t.add_row(f"    × {_num(c['ratio']):.2f} (interquartile {_num(c['low']):.2f}–{_num(c['high']):.2f}) "
                      f"over {c.get('stages_n')} stages' own CPU work", "", "", "", style="dim")
            continue
        for name in sorted(c.get("items") or [], key=lambda n: -abs(delta.get(n, 0.0))):
            if abs(delta.get(name, 0.0)) >= 0.05 and shown < max_items * 2:
                t.add_row(f"    {name}", f"{delta[name]:+,.1f}", _share_text(share.get(name)), "", style="dim")
                shown += 1
    if expl.get("unexplained_pct") is not None:
        t.add_row("unexplained", "", f"{_num(expl.get('unexplained_pct')):.1f} %", "", style="dim")
    basis = "CPU view" if expl.get("basis") == "cpu" else "latency view"
    gap = expl.get("gap_us_per_txn")
    measure = {"client_cycle_us": " of client time per transaction (clients / TPS, connection setup included)",
               "mean_latency_us": " of mean latency"}.get(expl.get("measure"), "")
    title = Text(f"{expl.get('run')} vs {expl.get('baseline', 'baseline')} — {basis}"
                 + (f", measured gap {_num(gap):+,.1f} {unit}{measure}" if gap is not None else ""), style="bold")
    why = Text(f"basis: {expl['basis_reason']}", style="dim") if expl.get("basis_reason") else Text("")
    lines = [title, Text(explain_text(expl)), why]
    sf = expl.get("speed_factor")
    if sf:
        share = f", {_num(sf['share_pct']):.0f} % of the gap" if sf.get("share_pct") is not None else ""
        lines.append(Text(f"speed: {speed_phrase(sf)}: {_num(sf['delta_us_per_txn']):+,.1f} {unit} "
                          f"({_num(sf['delta_low_us_per_txn']):+,.1f} … {_num(sf['delta_high_us_per_txn']):+,.1f})"
                          f"{share}"))
    for c in expl.get("causes") or []:       # a cause that says what it is (the cgroup and quota of `cpu quota`)
        if c.get("detail"):
            lines.append(Text(f"{c['name']}: {c['detail']}"))
    return Group(*lines, t)


def compare_view(summaries: list[dict | Summary], explanations: list[dict], spreads: dict[str, dict] | None = None):
    """Side-by-side table, then each run's explanation versus the baseline. `spreads` (label → repeats.spread())
    adds a TPS spread column for --repeat runs."""
    if not summaries:
        return Text("no runs to compare")
    parts = [_compare_table(summaries, spreads)]
    for expl in explanations:
        parts += [Text(""), explanation_view(expl)]
    return Group(*parts)


def predictions_view(predictions: list[dict]):
    """The first run's prediction of every other run, next to what was measured (analysis.predict)."""
    if not predictions:
        return Text("")
    t = Table(title="Predicted from the first run (pathprof predict) vs measured without probes", title_justify="left",
              show_edge=False)
    for col, kw in (("run", {}), ("predicted", {"justify": "right"}), ("band", {"justify": "right"}),
                    ("measured", {"justify": "right"}), ("error", {"justify": "right"}), ("limited by", {})):
        t.add_column(col, **kw)
    for p in predictions:
        if p.get("tps") is None:
            t.add_row(str(p.get("run")), "–", "", "", "", str(p.get("reason") or ""))
            continue
        err = p.get("error_pct")
        t.add_row(str(p.get("run")), f"{p['tps']:,.0f}", f"{p['tps_low']:,.0f}–{p['tps_high']:,.0f}",
                  _fmt(p.get("measured_tps"), ",.0f"),
                  Text("–" if err is None else f"{err:+.1f} %", style="green" if p.get("within_band") else "yellow"),
                  str(p.get("limited_by_text") or ""))
    return t


def lessons_view(lessons: list[dict]):
    """What each pair of runs taught this machine for later predictions (agent.host.machine_costs.pair_lesson), or
    why it taught nothing: a user who made a pair to teach `predict` learns here whether it did."""
    if not lessons:
        return Text("")
    lines = [Text("What the pairs taught this machine (for the next predictions)", style="bold")]
    for x in lessons:
        taught = x.get("value") is not None
        pair = " → ".join(Path(d).name for d in str(x.get("pair")).split(" -> "))
        lines.append(Text(f"  {'✓' if taught else '·'} {pair}: "
                          f"{x.get('why') if taught else 'nothing, ' + str(x.get('why'))}",
                          style="green" if taught else "yellow"))
    return Group(*lines)


def sweep_view(analysis: dict):
    pts = analysis.get("points") or []
    best = max((p["tps"] for p in pts), default=0.0)
    t = Table(title=f"Sweep: {analysis.get('topology')}", title_justify="left", show_edge=False)
    for col, kw in (("clients", {"justify": "right"}), ("TPS", {"justify": "right"}), ("", {"no_wrap": True}),
                    ("gain/doubling", {"justify": "right"}), ("mean ms", {"justify": "right"}),
                    ("p99 ms", {"justify": "right"}), ("regime", {}), ("", {})):
        t.add_column(col, **kw)
    for p in pts:
        lat = p.get("latency_ms") or {}
        gain = p.get("gain_per_doubling_pct")
        tps = _fmt(p["tps"], ",.0f") + (f" ({p['tps_min']:,.0f}…{p['tps_max']:,.0f})"   # --repeat spread
                                         if p.get("tps_min") is not None else "")
        t.add_row(str(p["clients"]), tps, Text(bar(p["tps"], best, 30), style="cyan"),
                  "" if gain is None else f"{gain:+.1f} %", _fmt(lat.get("mean"), ".3f"),
                  _fmt(lat.get("p99"), ".3f"), str(p.get("regime") or "?"),
                  "◀ knee" if p["clients"] == analysis.get("knee_clients") else "")
    parts = [t, Text(""), Text(sweep_text(analysis))]
    preds = [{**p["predicted_from_first"], "run": f"{p['clients']} clients"}
             for p in pts if p.get("predicted_from_first")]
    if preds:
        parts += [Text(""), predictions_view(preds)]
    for key, title, unit in (("stage_growth", "Stages, first → last client count", "µs/txn"),
                             ("cpu_growth", "CPU components, first → last client count", "CPU µs/txn")):
        rows = [r for r in analysis.get(key) or [] if r["delta_us_per_txn"]][:5]
        if rows:
            g = Table(title=title, title_justify="left", show_edge=False)
            for col in ("name", f"first {unit}", f"last {unit}", "Δ"):
                g.add_column(col, justify="left" if col == "name" else "right")
            for r in rows:
                g.add_row(r["name"], _fmt(r["first_us_per_txn"]), _fmt(r["last_us_per_txn"]),
                          f"{r['delta_us_per_txn']:+,.1f}")
            parts += [Text(""), g]
    return Group(*parts)


def _side_by_side(title: str, a: dict[str, float], b: dict[str, float], la: str, lb: str) -> Table | Text:
    if not a and not b:
        return Text(f"{title}: no figures in either run.", style="yellow")
    t = Table(title=title, title_justify="left", show_edge=False)
    for col in ("name", la, lb, "Δ"):
        t.add_column(col, justify="left" if col == "name" else "right")
    for name in sorted(dict.fromkeys([*a, *b]), key=lambda n: -abs(b.get(n, 0.0) - a.get(n, 0.0))):
        va, vb = a.get(name), b.get(name)
        t.add_row(name, _fmt(va), _fmt(vb), f"{(vb or 0.0) - (va or 0.0):+,.1f}")
    return t


def diff_view(a: dict | Summary, b: dict | Summary, expl: dict, host_diffs: list[str]):
    """Host/version/workload differences first (a gap between machines is not a gap between paths), then the
    two runs, the explanation, and both views side by side."""
    if host_diffs:
        hd = Panel(Text("\n".join(f"• {d}" for d in host_diffs)), title="These runs differ in more than the path",
                   title_align="left", border_style="yellow")
    else:
        hd = Text("Same host, versions and workload settings.", style="green")
    a, b = Summary.of(a), Summary.of(b)
    la = f"A: {Path(str(a.run_dir or run_label(a))).name}"
    lb = f"B: {Path(str(b.run_dir or run_label(b))).name}"
    return Group(hd, Text(""), _compare_table([a, b]), Text(""), explanation_view(expl, max_items=12), Text(""),
                 _side_by_side("Latency view, µs per transaction", stage_totals(a), stage_totals(b), la, lb),
                 Text(""), _side_by_side("CPU view, CPU µs per transaction", cpu_totals(a), cpu_totals(b), la, lb))
