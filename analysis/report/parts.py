"""Pieces of the HTML report that are not tables: the stylesheet, the sortable-table script, the cause legend,
the path diagrams (one per run, deltas against the first) and the transaction waterfalls, each read from the
run directory a summary names (topology.json, run.json, traces.parquet) and left out when it is missing."""
from __future__ import annotations

import html
from pathlib import Path

from pathprof.analysis.causes import hop_names
from pathprof.analysis.report import path_model, svg_path, waterfall
from pathprof.analysis.report.palette import CAUSE_COLORS, cause_color, cause_rank, hops_of, qdisc_aware_cause
from pathprof.analysis.run_model import Summary

CSS = """
body{font:15px/1.45 system-ui,-apple-system,Segoe UI,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;
color:#222}
h1{font-size:1.6em;margin-bottom:.2em}h2{margin-top:1.8em;border-bottom:1px solid #ddd;padding-bottom:.2em}
.lead{font-size:1.15em;background:#f3f7fb;border-left:4px solid #4e79a7;padding:.6em 1em;margin:.5em 0}
.caveat{background:#fff8e5;border-left:4px solid #edc948;padding:.5em 1em;margin:.4em 0}
.ok{background:#eef8ee;border-left:4px solid #59a14f;padding:.5em 1em;margin:.4em 0}
table{border-collapse:collapse;margin:.6em 0;font-variant-numeric:tabular-nums}
th,td{padding:.25em .7em;border-bottom:1px solid #eee;text-align:right}th{background:#fafafa}
td:first-child,th:first-child,td.l{text-align:left}tr.total td{font-weight:600;border-top:2px solid #ccc}
table.sortable th{cursor:pointer;user-select:none}table.sortable th:hover{background:#eef3f8}
th[aria-sort=ascending]::after{content:" \\25B2";font-size:.7em}th[aria-sort=descending]::after{content:" \\25BC";
font-size:.7em}
img{max-width:100%;height:auto;margin:.5em 0}.muted{color:#777;font-size:.9em}
.diagram{overflow-x:auto;margin:.6em 0 1.2em}.legend span{display:inline-block;margin:0 .9em .3em 0;font-size:.9em}
.legend i{display:inline-block;width:.9em;height:.9em;margin-right:.3em;vertical-align:-.1em;border-radius:2px}
"""

# Sort a table by a click on a column head: numbers (1,234.5 µs, +3.1 %, −2) as numbers, the rest as text.
SCRIPT = """
(function(){
function key(row,i){var c=row.cells[i];var t=c?c.textContent.trim():'';
var n=parseFloat(t.replace(/\\u2212/g,'-').replace(/[,\\s%+]|µs|ms|ns/g,''));return isNaN(n)?t.toLowerCase():n;}
document.querySelectorAll('table.sortable').forEach(function(t){
var heads=t.tHead?t.tHead.rows[0].cells:[];
Array.prototype.forEach.call(heads,function(th,i){th.addEventListener('click',function(){
var asc=th.getAttribute('aria-sort')!=='ascending';
Array.prototype.forEach.call(heads,function(h){h.removeAttribute('aria-sort');});
th.setAttribute('aria-sort',asc?'ascending':'descending');
var body=t.tBodies[0];var rows=Array.prototype.slice.call(body.rows);
rows.sort(function(a,b){var x=key(a,i),y=key(b,i);if(typeof x!==typeof y){x=String(x);y=String(y);}
return (x<y?-1:x>y?1:0)*(asc?1:-1);});
rows.forEach(function(r){body.appendChild(r);});});});});
document.documentElement.setAttribute('data-ready','1');
})();
"""


def _e(x) -> str:
    return html.escape(str(x))


def cause_legend(summaries: list[dict]) -> str:
    """The causes the charts and waterfalls use, with their colours (one legend for the whole report)."""
    hops = hops_of(summaries)
    causes = set()
    for s in summaries:
        s = Summary.of(s)
        causes |= {qdisc_aware_cause(str(st.name), hops) for st in s.stages}
        causes |= {qdisc_aware_cause(str(c.component), hops) for c in s.cpu}
    causes = sorted(causes & (set(CAUSE_COLORS) | {f"hop {h}" for h in hops}), key=lambda c: (cause_rank(c), c))
    if not causes:
        return ""
    return ('<p class="legend">Colours are causes (analysis/causes.py), the same in every chart: '
            + "".join(f'<span><i style="background:{cause_color(c, hops)}"></i>{_e(c)}</span>' for c in causes)
            + "</p>")


def _model(s: dict | Summary) -> dict:
    s = Summary.of(s)
    topo, spec = path_model.load_topology(s.run_dir)
    return path_model.build(s, topo, spec)


def diagrams(summaries: list[dict], labels: list[str]) -> str:
    """One path diagram per run; with several runs each shows its change against the first (the baseline)."""
    if not summaries:
        return ""
    models = [_model(s) for s in summaries]
    parts = ["<h2>The path</h2>",
             "<p class=\"muted\">Each box is a process on the path inside its host (network namespace or guest); "
             "the chips between them are the kernel work of each leg. A process's figure is its own work plus "
             "the time its messages waited for it (wakeup, CPU, queue). Hover an element for its stages.</p>"]
    for i, (s, m, label) in enumerate(zip(summaries, models, labels)):
        base = models[0] if i and len(models) > 1 else None
        title = label + (f" — Δ against {labels[0]}" if base else "")
        parts.append(f'<div class="diagram" data-run="{_e(label)}">{svg_path.render(m, base, title, uid=str(i))}</div>')
    return "\n".join(parts)


def _traces(run_dir) -> "object | None":
    if not run_dir:
        return None
    path = Path(run_dir) / "traces.parquet"
    if not path.exists():
        return None
    try:
        import pandas as pd
        return pd.read_parquet(path)
    except Exception:      # a damaged file costs the waterfall, not the report
        return None


def waterfalls(summaries: list[dict], labels: list[str]) -> str:
    parts = []
    for s, label in zip(summaries, labels):
        traces = _traces(Summary.of(s).run_dir)
        if traces is None:
            continue
        order = [p["id"] for p in _model(s)["processes"]]
        sec = waterfall.section(traces, order, hop_names(s), label)
        if sec:
            parts.append(sec)
    if not parts:
        return ""
    return "<h2>One transaction, as a waterfall</h2>\n" + "\n".join(parts)
