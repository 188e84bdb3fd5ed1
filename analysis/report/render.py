"""Terminal renderings (rich) of reports, comparisons, sweeps and diffs.

Every view is a pure function of summary documents / explanation dicts and returns a rich renderable; the CLI
prints it, tests turn it into plain text with `render_to_string`.
"""
from __future__ import annotations

import io
from pathlib import Path

from pathprof.analysis.explain import (
    _distinct_label,
    _num,
    cpu_totals,
    explain_text,
    measured_cpu_us,
    run_label,
    stage_totals,
)
from pathprof.analysis.sweep import sweep_text
from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

LEG_ORDER = ("request", "server", "response")
# Above this closure error a view's per-stage figures should not be trusted to add up; say so next to them.
CLOSURE_WARN_PCT = 5.0
_EIGHTHS = " ▏▎▍▌▋▊▉"


def bar(value: float, max_value: float, width: int = 30) -> str:
    """A horizontal bar with eighth-block resolution; negative or missing values give an empty bar."""
    if not max_value or value is None or value <= 0:
        return ""
    cells = min(value / max_value, 1.0) * width
    full = int(cells)
    frac = int((cells - full) * 8)
    return "█" * full + (_EIGHTHS[frac] if frac and full < width else "")


def render_to_string(renderable, width: int = 120) -> str:
    """Plain text (no colour codes) of a renderable at a fixed width: for tests, files and non-terminals."""
    console = Console(file=io.StringIO(), width=width, color_system=None, force_terminal=False,
                      highlight=False, emoji=False, legacy_windows=False)
    console.print(renderable)
    return console.file.getvalue()


def _fmt(x, spec: str = ",.1f", none: str = "–") -> str:
    return none if x is None else format(_num(x), spec)


def _closure_text(err, view: str) -> Text:
    if err is None:
        return Text(f"{view}: closure not measured", style="yellow")
    style = "yellow" if abs(_num(err)) > CLOSURE_WARN_PCT else "green"
    warn = " — does not close; per-stage figures are approximate" if style == "yellow" else ""
    return Text(f"{view} closes within {_num(err):+.1f} %{warn}", style=style)


def _legs(summary: dict) -> list[tuple[str, list[dict]]]:
    """Stages grouped by leg in request/server/response order, stages kept in path order within a leg."""
    groups: dict[str, list[dict]] = {}
    for st in summary.get("stages") or []:
        groups.setdefault(str(st.get("leg") or "other"), []).append(st)
    order = [leg for leg in LEG_ORDER if leg in groups] + [leg for leg in groups if leg not in LEG_ORDER]
    return [(leg, groups[leg]) for leg in order]


def header(summary: dict) -> Panel:
    lat = summary.get("latency_ms") or {}
    closure = summary.get("closure") or {}
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    tps_line = _throughput_text(summary)
    if summary.get("status") not in (None, "complete"):
        grid.add_row("status", Text(f"{summary['status']}" + (": " + "; ".join(summary["failure"])
                                                              if summary.get("failure") else ""), style="bold red"))
    grid.add_row("throughput", tps_line)
    pred = summary.get("prediction") or {}
    if pred.get("error_pct") is not None:
        outside = _fmt(pred["measured_outside_tps"], ",.0f")
        grid.add_row("truth check", f"the model's TPS without probes against the {outside} measured outside the "
                                    f"probe windows: {_num(pred['error_pct']):+.1f} %")
    grid.add_row("latency (ms)", "  ".join(f"{k} {_fmt(lat.get(k), '.3f')}" for k in ("mean", "p50", "p95", "p99")))
    regime = summary.get("regime") or "unknown"
    why = {"cpu-bound": "CPUs saturated: the CPU view explains throughput",
           "latency-bound": "CPUs not saturated: the latency view explains throughput"}.get(regime, "")
    grid.add_row("regime", f"{regime}" + (f" ({why})" if why else ""))
    grid.add_row("probe cost", _probe_cost_text(summary))
    grid.add_row("closure", Text.assemble(_closure_text(closure.get("latency_error_pct"), "latency view"), "; ",
                                          _closure_text(closure.get("cpu_error_pct"), "CPU view")))
    gap = closure.get("gap")
    if gap:
        text = (f"{gap['short_us_per_txn']:,.1f} µs per transaction in no stage: {gap['statement']}"
                if gap["short_us_per_txn"] > 0 else gap["statement"])
        if gap.get("evidence"):
            text += f" (probe counters: {gap['evidence']})"
        grid.add_row("where", Text(text, style="yellow"))
    grid.add_row("workload", _workload_text(summary))
    host = summary.get("host") or {}
    if host:
        grid.add_row("host", ", ".join(f"{k} {host[k]}" for k in ("hostname", "kernel", "cpus") if host.get(k)))
    if summary.get("accelerator"):
        grid.add_row("accelerator", str(summary["accelerator"]))
    if summary.get("setup_s"):
        grid.add_row("set-up", setup_text(summary["setup_s"]))
    if summary.get("run_dir"):
        grid.add_row("run", str(summary["run_dir"]))
    return Panel(grid, title=f"pathprof — {run_label(summary)}", title_align="left")


def _throughput_text(summary: dict) -> str:
    """TPS and what it was measured on (outside the probe windows, or observed), and the model's figure."""
    tps_line = f"{_fmt(summary.get('tps'), ',.0f')} TPS measured"
    if summary.get("tps_basis"):
        tps_line += f" ({summary['tps_basis']}"
        if summary.get("tps_in_windows") and "outside" in summary["tps_basis"]:
            tps_line += f"; {_fmt(summary['tps_in_windows'], ',.0f')} inside them, what the stages are divided by"
        tps_line += ")"
    if summary.get("driver") == "observed":
        tps_line = f"{_fmt(summary.get('tps'), ',.0f')} exchanges/s observed by the probes"
    if summary.get("predicted_tps") is not None:
        tps_line += f", {_fmt(summary['predicted_tps'], ',.0f')} predicted by the model without probes"
    return tps_line


def _probe_cost_text(summary: dict) -> str | Text:
    """The probes' own cost per transaction, as a share of what limits the run (its CPU, or its cycle)."""
    cost = summary.get("probe_cost_ns_per_txn")
    if cost is None:
        return Text("not measured", style="yellow")
    of = {"cpu": "of the CPU per transaction: CPU-bound, so about that share of throughput",
          "cycle": "of the cycle: latency-bound"}.get(summary.get("probe_cost_share_of"))
    share = f" ({_num(summary['probe_cost_share_pct']):.2f} % {of})" if of else ""
    return f"{_fmt(cost, ',.0f')} ns per transaction{share}; carved out of the CPU view as `probes`"


def _workload_text(summary: dict) -> str:
    wl = summary.get("workload") or {}
    bits = [f"{summary.get('clients', '?')} clients"]
    bits += [f"{wl['threads']} threads"] if wl.get("threads") else []
    bits += [str(wl[k]) for k in ("mode", "script") if wl.get(k)]
    bits += ["new connection per transaction"] if wl.get("connect") else []
    bits += [f"{_fmt(summary.get('duration_s'), 'g')} s"] if summary.get("duration_s") is not None else []
    return ", ".join(bits)


def setup_text(setup: dict) -> str:
    """Where the run's wall-clock time went outside pgbench (run.json `setup_s`)."""
    total, bench = setup.get("total"), setup.get("pgbench")
    parts = [f"{k} {v:.2f}" for k, v in setup.items() if k not in ("total", "pgbench") and v >= 0.005]
    if total is not None:
        other = total - sum(v for k, v in setup.items() if k != "total")
        parts += [f"other {other:.2f}"] if other >= 0.005 else []
    head = f"{total:.1f} s end to end" if total is not None else ""
    if total is not None and bench is not None:
        head += f", {total - bench:.1f} s outside pgbench's {bench:.1f} s"
    return head + (": " if head and parts else "") + ", ".join(parts)


def _no_data(summary: dict, view: str) -> Text:
    level = summary.get("probes") if isinstance(summary.get("probes"), str) else None
    why = f" (probes: {level})" if level else ""
    return Text(f"{view}: no per-stage figures in this run{why}; only pgbench's totals above.", style="yellow")


def latency_table(summary: dict, bar_width: int = 30) -> Table | Text:
    stages = summary.get("stages") or []
    if not stages:
        return _no_data(summary, "Latency view")
    # parts of a stage (backend.execute's deep split) are inside it: shown under it, not summed again
    total = sum(_num(st.get("us_per_txn")) for st in stages if not st.get("parent"))
    biggest = max((_num(st.get("us_per_txn")) for st in stages), default=0.0)
    t = Table(title="Latency view: µs per transaction per stage", title_justify="left", show_edge=False)
    for col, kw in (("leg", {}), ("stage", {}), ("µs/txn", {"justify": "right"}), ("p99 µs", {"justify": "right"}),
                    ("share", {"justify": "right"}), ("", {"no_wrap": True})):
        t.add_column(col, **kw)
    for i, (leg, rows) in enumerate(_legs(summary)):
        if i:
            t.add_section()
        for j, st in enumerate(rows):
            us = _num(st.get("us_per_txn"))
            part = bool(st.get("parent"))      # phases (deep: parse/plan/executor) overlap the parts: "·"
            t.add_row(leg if j == 0 else "", ("  · " if st.get("phase") else "  ↳ " if part else "")
                      + str(st.get("name")), _fmt(us),
                      _fmt(st.get("p99_us")), f"{us / total * 100:.1f} %" if total else "–",
                      Text(bar(us, biggest, bar_width), style="dim cyan" if part else "cyan"),
                      style="dim" if part else None)
    t.add_section()
    mean_us = (summary.get("latency_ms") or {}).get("mean")
    cycle = (summary.get("closure") or {}).get("cycle_us")
    split = (summary.get("closure") or {}).get("execute_split")
    if split:   # the ↳ parts of backend.execute are exclusive: they add up to it (other = what they leave)
        t.add_row("", "↳ backend.execute's waits and I/O", _fmt(_num(split.get("parts_us"))), "",
                  f"{_num(split.get('parts_pct')):.1f} % of it", "", style="dim")
    t.add_row("", "sum of stages", _fmt(total), "", "", "", style="bold")
    if cycle:
        # The stages tile each connection's timeline: they close against the cycle, clients / TPS.
        t.add_row("", "measured cycle (clients ÷ TPS)", _fmt(_num(cycle)), "", "", "", style="bold")
    if mean_us is not None:
        label = "observed mean latency" if summary.get("driver") == "observed" else "pgbench mean latency"
        t.add_row("", label, _fmt(_num(mean_us) * 1000), "", "", "", style="dim")
    return t


def cpu_table(summary: dict, bar_width: int = 30) -> Table | Text:
    rows = sorted(summary.get("cpu") or [], key=lambda c: -_num(c.get("us_per_txn")))
    if not rows:
        return _no_data(summary, "CPU view")
    total = sum(_num(c.get("us_per_txn")) for c in rows)
    biggest = max((_num(c.get("us_per_txn")) for c in rows), default=0.0)
    t = Table(title="CPU view: CPU µs per transaction per component", title_justify="left", show_edge=False)
    for col, kw in (("component", {}), ("µs/txn", {"justify": "right"}), ("share", {"justify": "right"}),
                    ("", {"no_wrap": True})):
        t.add_column(col, **kw)
    for c in rows:
        us = _num(c.get("us_per_txn"))
        t.add_row(str(c.get("component")), _fmt(us), f"{us / total * 100:.1f} %" if total else "–",
                  Text(bar(us, biggest, bar_width), style="magenta"))
    t.add_section()
    t.add_row("sum of components", _fmt(total), "", "", style="bold")
    if rows and (summary.get("closure") or {}).get("cpu_error_pct") is not None:
        t.add_row("measured (busy CPU / txn)", _fmt(measured_cpu_us(summary)), "", "", style="bold")
    return t


def connection_table(summary: dict, bar_width: int = 30) -> Table | None:
    rows = summary.get("connection_setup") or []
    if not rows:
        return None
    total = sum(_num(r.get("us_per_conn")) for r in rows)
    biggest = max((_num(r.get("us_per_conn")) for r in rows), default=0.0)
    t = Table(title="Connection setup: µs per connection", title_justify="left", show_edge=False)
    for col, kw in (("step", {}), ("µs/conn", {"justify": "right"}), ("share", {"justify": "right"}),
                    ("", {"no_wrap": True})):
        t.add_column(col, **kw)
    for r in rows:
        us = _num(r.get("us_per_conn"))
        t.add_row(str(r.get("name")), _fmt(us), f"{us / total * 100:.1f} %" if total else "–",
                  Text(bar(us, biggest, bar_width), style="yellow"))
    t.add_section()
    t.add_row("total", _fmt(total), "", "", style="bold")
    return t


def _notes(summary: dict) -> Text | None:
    notes = summary.get("notes")
    if not notes:
        return None
    notes = [notes] if isinstance(notes, str) else list(notes)
    return Text("Notes:\n" + "\n".join(f"  • {n}" for n in notes), style="italic")


def disk_table(summary: dict) -> Table | None:
    """The block devices' own time during the probe windows (all requests on the machine)."""
    rows = [d for d in summary.get("disk") or [] if d.get("requests_per_txn")]
    if not rows:
        return None
    t = Table(title="Disk: block device time while probed (every request on the machine)", title_justify="left",
              show_edge=False)
    for col in ("device", "op", "requests/txn", "µs/txn", "mean µs", "p99 µs"):
        t.add_column(col, justify="left" if col in ("device", "op") else "right")
    for d in rows:
        t.add_row(str(d["device"]), str(d["op"]), _fmt(d["requests_per_txn"], ",.3f"), _fmt(d["us_per_txn"]),
                  _fmt(d["mean_us"]), _fmt(d.get("p99_us")))
    return t


def script_label(name) -> str:
    """A script file's transaction type (tpcc_new_order.sql -> new_order); builtin names as pgbench gives them."""
    name = str(name or "")
    if name.startswith("<") or "/" not in name:
        return name
    return name.rsplit("/", 1)[1].removesuffix(".sql").removeprefix("tpcc_")


def statements_table(summary: dict) -> Table | None:
    """pgbench -r: per script (transaction type) its share and latency, and each statement's mean latency."""
    scripts = [s for s in summary.get("scripts") or [] if s.get("statements")]
    if not scripts:
        return None
    t = Table(title="Statements (pgbench -r): mean ms per statement", title_justify="left", show_edge=False)
    t.add_column("script / statement", overflow="fold")
    t.add_column("ms", justify="right")
    t.add_column("", justify="right")
    for s in scripts:
        if len(scripts) > 1 or s.get("name"):
            lat = (s.get("latency_ms") or {}).get("mean")
            t.add_row(Text(script_label(s.get("name")), style="bold"), _fmt(lat, ",.3f"),
                      f"{_fmt(s.get('tps'), ',.0f')} TPS" if s.get("tps") is not None else "")
        for st in s["statements"]:
            t.add_row(f"  {st['sql'][:100]}", _fmt(st["latency_ms"], ",.3f"),
                      f"{st['failures']} failed" if st.get("failures") else "")
    return t


def retransmit_line(r: dict) -> str:
    """One sentence on packet loss: how many retransmissions, on which legs, and what they cost the cycle."""
    legs: dict[str, int] = {}
    kinds: dict[str, int] = {}
    for row in r.get("by_leg") or []:
        legs[row["leg"]] = legs.get(row["leg"], 0) + row["count"]
        kinds[row["kind"]] = kinds.get(row["kind"], 0) + row["count"]
    names = {"rto": "after a timeout", "fast": "in fast recovery", "probe": "as tail loss probes"}
    on_legs = ", ".join(f"{v:,} on the {k} leg" for k, v in legs.items())
    text = (f"TCP retransmissions: {r.get('count', 0):,} ({on_legs}; "
            f"{', '.join(f'{v:,} {names.get(k, k)}' for k, v in kinds.items())}); the messages they delivered "
            f"waited {r.get('wait_us_per_txn', 0):,.1f} µs per transaction for them")
    if r.get("wait_share_pct") is not None:
        text += f", {r['wait_share_pct']:.1f} % of the stages"
    if r.get("kernel_retrans_segs") is not None:
        text += f"; the kernel counted {r['kernel_retrans_segs']:,} (RetransSegs in the path's namespaces)"
    return text


def report_view(summary: dict):
    parts = [header(summary), latency_table(summary), Text(""), cpu_table(summary)]
    conn = connection_table(summary)
    if conn is not None:
        parts += [Text(""), conn]
    for extra in (statements_table(summary), disk_table(summary)):
        if extra is not None:
            parts += [Text(""), extra]
    if summary.get("tcp_retransmits"):
        parts += [Text(""), Text(retransmit_line(summary["tcp_retransmits"]))]
    if summary.get("pooler_counters"):
        from pathprof.analysis.pooler import describe
        parts += [Text(""), Text("\n".join(describe(r) for r in summary["pooler_counters"]))]
    notes = _notes(summary)
    if notes is not None:
        parts += [Text(""), notes]
    return Group(*parts)


def _top_stages(summary: dict, n: int = 3) -> str:
    totals = sorted(stage_totals(summary).items(), key=lambda kv: -kv[1])[:n]
    return "\n".join(f"{name} {us:,.0f}" for name, us in totals)     # one per line: wrapping splits pairs


def _compare_table(summaries: list[dict], spreads: dict | None = None) -> Table:
    base = summaries[0]
    base_tps = _num(base.get("tps"))
    t = Table(title="Runs (first is the baseline)", title_justify="left", show_edge=False)
    cols = [("run", {}), ("TPS", {"justify": "right"}), ("Δ TPS", {"justify": "right"})]
    cols += [("spread", {"justify": "right"})] if spreads else []
    cols += [("mean ms", {"justify": "right"}), ("p99 ms", {"justify": "right"}), ("regime", {}),
             ("predicted", {"justify": "right"}), ("top stages (µs/txn)", {})]
    for col, kw in cols:
        t.add_column(col, **kw)
    for i, s in enumerate(summaries):
        label = run_label(s) if i == 0 else _distinct_label(base, s)
        tps = _num(s.get("tps"))
        row = [label, _fmt(tps, ",.0f"), "baseline" if i == 0 else
               (f"{(tps - base_tps) / base_tps * 100:+.1f} %" if base_tps else "–")]
        if spreads:
            sp = spreads.get(label) or spreads.get(run_label(s))
            row.append(f"±{sp['stdev']:,.0f} ({sp['min']:,.0f}–{sp['max']:,.0f}, n={sp['n']})" if sp else "")
        lat = s.get("latency_ms") or {}
        row += [_fmt(lat.get("mean"), ".3f"), _fmt(lat.get("p99"), ".3f"), str(s.get("regime") or "?"),
                _fmt(s.get("predicted_tps"), ",.0f"), _top_stages(s)]
        t.add_row(*row)
    return t


def _share_text(share) -> str:
    return "–" if share is None else f"{_num(share):.1f} %"


def explanation_view(expl: dict, max_items: int = 8):
    """The sentence, then the causes ranked by share of the measured gap with the items that moved under each,
    then the remainder. An unranked gap (within noise, smaller than its parts) lists the moves by size, no shares."""
    unit = "CPU µs/txn" if expl.get("basis") == "cpu" else "µs/txn"
    t = Table(show_edge=False, box=None, padding=(0, 2))
    for col, kw in (("", {}), (f"Δ {unit}", {"justify": "right"}), ("share", {"justify": "right"}),
                    ("", {"no_wrap": True})):
        t.add_column(col, **kw)
    delta = {it["name"]: _num(it.get("delta_us_per_txn")) for it in expl.get("items") or []}
    share = {it["name"]: it.get("share_pct") for it in expl.get("items") or []}
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
    return Group(title, Text(explain_text(expl)), why, t)


def compare_view(summaries: list[dict], explanations: list[dict], spreads: dict[str, dict] | None = None):
    """Side-by-side table, then each run's explanation versus the baseline. `spreads` (label → explain.spread())
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


def diff_view(a: dict, b: dict, expl: dict, host_diffs: list[str]):
    """Host/version/workload differences first (a gap between machines is not a gap between paths), then the
    two runs, the explanation, and both views side by side."""
    if host_diffs:
        hd = Panel(Text("\n".join(f"• {d}" for d in host_diffs)), title="These runs differ in more than the path",
                   title_align="left", border_style="yellow")
    else:
        hd = Text("Same host, versions and workload settings.", style="green")
    la = f"A: {Path(str(a.get('run_dir') or run_label(a))).name}"
    lb = f"B: {Path(str(b.get('run_dir') or run_label(b))).name}"
    return Group(hd, Text(""), _compare_table([a, b]), Text(""), explanation_view(expl, max_items=12), Text(""),
                 _side_by_side("Latency view, µs per transaction", stage_totals(a), stage_totals(b), la, lb),
                 Text(""), _side_by_side("CPU view, CPU µs per transaction", cpu_totals(a), cpu_totals(b), la, lb))
