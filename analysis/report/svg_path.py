"""The path diagram of the HTML report: an inline SVG drawn from analysis.report.path_model.

Processes sit in path order in the middle row inside boxes for their hosts; the request leg runs left to right
above them, the response leg right to left below, each with the kernel work between two neighbours (wire,
netfilter hooks, devices, qdiscs) as chips. Every element shows its µs per transaction and its share of the
transaction, and is filled on one colour ramp scaled to the largest element, so the biggest cost is the darkest
thing on the page. Every element is an SVG group with data-element / data-name / data-leg / data-us-per-txn
attributes, which is how tests (and scripts scraping a report) find it.
"""
from __future__ import annotations

import html
import textwrap

from pathprof.analysis.report.path_model import elements

COL_W, GAP, PAD, MIN_W = 156, 196, 16, 860
CHIP_H, CHIP_GAP = 30, 4
PROC_H, HOST_PAD = 92, 22
_RAMP = [(247, 247, 247), (253, 224, 197), (245, 158, 76), (215, 48, 31), (127, 0, 0)]


def _e(x) -> str:
    return html.escape(str(x), quote=True)


def ramp(t: float) -> str:
    """Colour for an intensity in [0, 1] (share of the largest element): light grey -> orange -> dark red."""
    t = min(max(t, 0.0), 1.0) * (len(_RAMP) - 1)
    i = min(int(t), len(_RAMP) - 2)
    f = t - i
    a, b = _RAMP[i], _RAMP[i + 1]
    return "#%02x%02x%02x" % tuple(round(a[k] + (b[k] - a[k]) * f) for k in range(3))


def _ink(t: float) -> str:
    return "#fff" if t > 0.55 else "#222"


def _fmt_us(us) -> str:
    if us is None:
        return "–"
    return f"{us:,.0f} µs" if abs(us) >= 100 else f"{us:,.1f} µs" if abs(us) >= 1 else f"{us:.2f} µs"


def _delta(key, model_elems, base_elems) -> str:
    if base_elems is None:
        return ""
    now, before = model_elems.get(key), base_elems.get(key)
    if now is None and before is None:
        return ""
    d = (now or 0.0) - (before or 0.0)
    if before is None:
        return " (new)"
    return f" Δ {d:+,.1f}"


def _attr(x) -> str:
    return "" if x is None else f"{x:.3f}"


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def render(model: dict, baseline: dict | None = None, title: str = "", uid: str = "") -> str:
    """The SVG element (a string to inline in HTML5, which needs no xmlns). With `baseline` (another run's model),
    every element also shows its change against it; `uid` keeps ids apart when a page holds several diagrams."""
    procs = model["processes"]
    legs = model["legs"]
    total = model["total_us"] or 0.0
    mine, base = elements(model), (elements(baseline) if baseline else None)
    biggest = max([abs(v) for v in mine.values() if v is not None] + [1e-9])
    measured = total > 0          # a run with --probes off has pgbench's figures only
    n = len(procs)
    width = max(2 * PAD + n * COL_W + (n - 1) * GAP, MIN_W)
    max_req = max([len(s["elements"]) for s in legs.get("request") or []] + [1])
    max_resp = max([len(s["elements"]) for s in legs.get("response") or []] + [1])
    req_h, resp_h = max_req * (CHIP_H + CHIP_GAP) + 22, max_resp * (CHIP_H + CHIP_GAP) + 22
    y_req_arrow = 44 + req_h
    y_proc = y_req_arrow + HOST_PAD + 10
    proc_h = PROC_H + (20 if base is not None else 0)     # a line for the change against the baseline
    y_resp_arrow = y_proc + proc_h + 18
    footer = [] if measured else [("no stage figures: this run was made with --probes off (or its probe windows held "
                                   "no transaction), so only the path's shape is drawn", "")]
    footer += [(part, attrs) for line, attrs in _footer(model)
              for part in textwrap.wrap(line, 150, subsequent_indent="    ")]
    height = y_resp_arrow + resp_h + 20 + 16 * len(footer)
    x_of = {p["id"]: PAD + i * (COL_W + GAP) for i, p in enumerate(procs)}
    arrow = f"pp-arrow{uid}"
    out = [f'<svg class="pp-path" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" data-topology="{_e(model.get("topology") or "")}" '
           f'data-total-us="{total:.3f}" font-family="system-ui,sans-serif" font-size="11">',
           f'<defs><marker id="{arrow}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
           'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#555"/></marker></defs>',
           f'<text x="{PAD}" y="18" font-size="14" font-weight="600">{_e(title or "The measured path")}</text>',
           f'<text x="{PAD}" y="34" fill="#555">request leg → (above), ← response leg (below); colour: share of the '
           f'largest element; figures are µs per transaction of the {total:,.1f} µs cycle</text>']
    out += _hosts(model, x_of, y_proc, proc_h)
    for p in procs:
        out += _process_box(p, x_of[p["id"]], y_proc, proc_h, total, biggest, measured, mine, base)
    for leg, segs in legs.items():
        for seg in segs:
            out += _segment(seg, leg, x_of, total, biggest, mine, base,
                            y_req_arrow if leg == "request" else y_resp_arrow, arrow)
    y = y_resp_arrow + resp_h + 16
    for line, attrs in footer:
        out.append(f'<text x="{PAD}" y="{y}" fill="#444" {attrs}>{_e(line)}</text>')
        y += 16
    out.append("</svg>")
    return "\n".join(out)


def _process_box(p: dict, x: int, y_proc: int, proc_h: int, total: float, biggest: float, measured: bool,
                 mine: dict, base: dict | None) -> list[str]:
    """One process of the path: its box coloured by its share, its figures, the change against the baseline."""
    t = abs(p["us"]) / biggest
    key = ("process", p["id"], "")
    share = p["us"] / total * 100 if total else 0.0
    tip = "\n".join([f"{p['label']} ({p.get('process')}, pids {', '.join(map(str, p.get('pids') or [])) or '?'})"]
                    + [f"{s['name']} [{s['leg']}]: {_fmt_us(s['us'])}" for s in p["stages"]]
                    + [f"CPU {c['name']}: {_fmt_us(c['us'])}" for c in p["cpu"]])
    out = [f'<g class="pp-el" data-element="process" data-kind="{_e(p["kind"])}" data-name="{_e(p["id"])}" '
           f'data-us-per-txn="{_attr(p["us"] if measured else None)}" '
           f'data-cpu-us-per-txn="{_attr(p["cpu_us"] if p["cpu"] else None)}" '
           f'data-share-pct="{f"{share:.1f}" if measured else ""}"><title>{_e(tip)}</title>'
           f'<rect x="{x}" y="{y_proc}" width="{COL_W}" height="{proc_h}" rx="8" fill="{ramp(t)}" '
           f'stroke="#333" stroke-width="1.2"/>']
    ink = _ink(t)
    lines = [(f"{_clip(p['label'], 24)}", 13, "600"),
             (f"{_fmt_us(p['us'])} · {share:.1f} %" if measured else "no stage figures", 12, "600")]
    if base is not None:
        d = _delta(key, mine, base).strip()
        lines.append(("not in the baseline" if d == "(new)" else f"{d or 'Δ –'} µs vs baseline", 11, "600"))
    lines += [(f"work {_fmt_us(p['own_us'])} · waits {_fmt_us(p['wait_us'])}", 10, "400"),
              (f"CPU {_fmt_us(p['cpu_us'])}" if p["cpu"] else "CPU not measured", 10, "400")]
    for i, (text, size, weight) in enumerate(lines):
        out.append(f'<text x="{x + 8}" y="{y_proc + 20 + i * 20}" font-size="{size}" font-weight="{weight}" '
                   f'fill="{ink}">{_e(text)}</text>')
    out.append("</g>")
    return out


def _hosts(model: dict, x_of: dict, y_proc: int, proc_h: int) -> list[str]:
    """One box per run of neighbouring processes on the same host (a host revisited later gets a second box)."""
    out = []
    procs = model["processes"]
    info = {h["name"]: h for h in model["hosts"]}
    runs: list[tuple[str, list[str]]] = []
    for p in procs:
        name = p.get("host") or (f"netns {p['netns']}" if p.get("netns") else None)
        if name and runs and runs[-1][0] == name:
            runs[-1][1].append(p["id"])
        elif name:
            runs.append((name, [p["id"]]))
    for name, ids in runs:
        h = info.get(name, {})
        x0, x1 = x_of[ids[0]] - 8, x_of[ids[-1]] + COL_W + 8
        label = name + (f" · netns {h['netns']}" if h.get("netns") else "") + (
            f" · {', '.join(h['addresses'])}" if h.get("addresses") else "")
        out.append(f'<g class="pp-el" data-element="host" data-name="{_e(name)}" '
                   f'data-netns="{_e(h.get("netns") or "")}"><title>{_e(label)}</title>'
                   f'<rect x="{x0}" y="{y_proc - HOST_PAD}" width="{x1 - x0}" height="{proc_h + HOST_PAD + 8}" '
                   f'rx="10" fill="#eef3f8" stroke="#8aa4c0" stroke-dasharray="5 3"/>'
                   f'<text x="{x0 + 8}" y="{y_proc - 7}" fill="#36506e" font-size="10">'
                   f'{_e(_clip(label, int((x1 - x0) / 5.6)))}</text></g>')
    return out


def _segment(seg, leg, x_of, total, biggest, mine, base, y_arrow, arrow) -> list[str]:
    if seg["from"] not in x_of or seg["to"] not in x_of:
        return []
    a, b = x_of[seg["from"]], x_of[seg["to"]]
    left, right = min(a, b) + COL_W + 10, max(a, b) - 10
    out = []
    x1, x2 = (left, right) if leg == "request" else (right, left)
    out.append(f'<line x1="{x1}" y1="{y_arrow}" x2="{x2}" y2="{y_arrow}" stroke="#555" stroke-width="1.5" '
               f'marker-end="url(#{arrow})"/>')
    sum_us = sum(e["us"] or 0.0 for e in seg["elements"])
    label_y = y_arrow - 5 if leg == "request" else y_arrow + 13
    out.append(f'<text x="{left + 2}" y="{label_y}" fill="#555" font-size="10">{_e(leg)}: in transit '
               f'{_e(_fmt_us(sum_us))}</text>')
    chip_w = right - left
    for i, el in enumerate(seg["elements"]):
        if leg == "request":       # path order top-down, ending at the arrow
            y = y_arrow - 18 - (len(seg["elements"]) - i) * (CHIP_H + CHIP_GAP)
        else:
            y = y_arrow + 18 + i * (CHIP_H + CHIP_GAP)
        us = el["us"]
        t = abs(us) / biggest if us is not None else 0.0
        share = (us / total * 100) if (us is not None and total) else None
        key = (el["kind"], el["name"], leg)
        element = {"dev": "device", "qdisc": "qdisc", "delay": "delay", "netfilter": "netfilter",
                   "wire": "wire"}.get(el["kind"],
                                                                                                   el["kind"])
        tip = (f"{el['name']} [{leg}] {seg['from']} → {seg['to']}: {_fmt_us(us)}"
               + (f", p99 {_fmt_us(el['p99_us'])}" if el.get("p99_us") is not None else "")
               + f"\nplacement: {el['placement']}")
        fill = ramp(t) if us is not None else "#fafafa"
        dash = "" if us is not None else ' stroke-dasharray="3 2"'
        out.append(f'<g class="pp-el" data-element="{element}" data-name="{_e(el["name"])}" data-leg="{leg}" '
                   f'data-us-per-txn="{"" if us is None else f"{us:.3f}"}" '
                   f'data-share-pct="{"" if share is None else f"{share:.1f}"}"><title>{_e(tip)}</title>'
                   f'<rect x="{left}" y="{y}" width="{chip_w}" height="{CHIP_H}" rx="4" fill="{fill}" '
                   f'stroke="{"#999" if us is not None else "#ccc"}"'
                   f"{dash}/>")
        ink = _ink(t) if us is not None else "#999"
        figure = (f"{_fmt_us(us)} · {share:.1f} %" if share is not None else _fmt_us(us)) + _delta(key, mine, base)
        out.append(f'<text x="{left + 6}" y="{y + 12}" font-size="10" fill="{ink}">'
                   f'{_e(_clip(el["label"], int(chip_w / 5.8)))}</text>'
                   f'<text x="{left + 6}" y="{y + 25}" font-size="10" font-weight="600" fill="{ink}">'
                   f'{_e(figure if us is not None else "no stage of its own")}</text></g>')
    return out


def _footer(model: dict) -> list[tuple[str, str]]:
    lines = []
    if model.get("kernel_cpu"):
        lines.append(("CPU outside the path's processes (CPU µs per transaction): " + ", ".join(
            f"{c['name']} {c['us']:,.1f}" for c in sorted(model["kernel_cpu"], key=lambda c: -c["us"])), ""))
    for leg, items in model.get("unplaced", {}).items():
        if items:
            lines.append((f"{leg} stages not placed on the drawing: " + ", ".join(
                f"{i['name']} {_fmt_us(i['us'])}" for i in items), 'data-element="unplaced"'))
    lonely = [h["name"] for h in model["hosts"] if not h["processes"]]
    if lonely:
        lines.append(("hosts of the path with none of its processes: " + ", ".join(lonely), ""))
    if not model.get("has_topology_json"):
        lines.append(("this run directory has no topology.json: the chain is inferred from the stage names", ""))
    return lines
