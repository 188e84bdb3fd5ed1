"""One transaction as a waterfall, from the sampled spans of `--trace-sample` (traces.parquet).

The probes stamp each message's stages back to back (a stage ends exactly where the next begins), so the spans
of one transaction form a chain of contiguous spans: pgbench's request crosses the wire into the next process,
waits, is worked on, is forwarded, ..., and ends with pgbench's own work before its next request
(`client.pgbench`). Every message of a transaction carries the client's transaction number (the probes pass
it from each receive to the next send), so a sampled number covers the whole transaction; the chains that cover
every leg (request, server, response, client) are the transactions drawn here, the typical one (p50 of their
durations) and a slow one (p99). Where a sender is not known at delivery (a delayed link, a guest), a socket
falls back to its own count and a chain can break; then the chains that cover the most of the path (most legs,
then most processes) are drawn instead, marked as partial.
"""
from __future__ import annotations

import html

import pandas as pd
from pathprof.analysis.report.palette import cause_color, qdisc_aware_cause

LEGS = {"request", "server", "response", "client"}
ROW_H, LABEL_W, WIDTH = 26, 150, 1000


def transactions(traces: pd.DataFrame | None) -> list[dict]:
    """Complete transactions: [{spans: [{stage, role, leg, start_ns, dur_ns}] in time order, dur_ns}]."""
    return _chains(traces)[0]


def partial_chains(traces: pd.DataFrame | None) -> list[dict]:
    """When no transaction is complete: the chains that cover the most of the path (legs, then processes)."""
    chains = _chains(traces)[1]
    if not chains:
        return []

    def cover(t):
        return len({sp["leg"] for sp in t["spans"]}), len({sp["role"] for sp in t["spans"]})
    best = max(cover(t) for t in chains)
    return [t for t in chains if cover(t) == best]


def chain_rows(traces: pd.DataFrame | None) -> tuple[pd.DataFrame, list[tuple[list[int], bool]]]:
    """The spans sorted by start (a frame indexed 0..n-1) and its chains: [(row positions in time order,
    complete)], complete when the chain covers every leg (request, server, response, client), else a chain of
    two spans or more that is not (a host's agent sees only its part of the path). Spans in no chain of two
    are in none of them."""
    if traces is None or not len(traces) or not {"ts_ns", "dur_ns", "stage"} <= set(traces.columns):
        return pd.DataFrame(), []
    df = traces.dropna(subset=["ts_ns", "dur_ns"]).sort_values("ts_ns", kind="stable").reset_index(drop=True)
    ts = df["ts_ns"].astype("int64").tolist()
    dur = df["dur_ns"].astype("int64").tolist()
    leg = (df["leg"].fillna("").astype(str) if "leg" in df else pd.Series([""] * len(df))).tolist()
    txn = df["txn"].tolist() if "txn" in df else [None] * len(df)
    starts: dict[int, list[int]] = {}
    for i, t in enumerate(ts):
        starts.setdefault(t, []).append(i)
    succ: dict[int, int] = {}
    has_pred: set[int] = set()
    for i in range(len(ts)):
        nxt = [j for j in starts.get(ts[i] + dur[i], []) if j != i and j not in has_pred and dur[i] > 0]
        if nxt:                      # two spans may start at one instant (a hop's event loop): same number first
            same = [j for j in nxt if txn[j] == txn[i]]
            succ[i] = (same or nxt)[0]
            has_pred.add(succ[i])
    out: list[tuple[list[int], bool]] = []
    for i in range(len(ts)):
        if i in has_pred:
            continue
        chain = [i]
        while chain[-1] in succ:
            chain.append(succ[chain[-1]])
        cur: list[int] = []
        for j in chain:              # a chain can hold consecutive transactions: client.pgbench ends each
            cur.append(j)
            if leg[j] == "client":
                if LEGS <= {leg[k] for k in cur}:
                    out.append((cur, True))
                elif len(cur) > 1:
                    out.append((cur, False))
                cur = []
        if len(cur) > 1:
            out.append((cur, False))
    return df, out


def _chains(traces) -> tuple[list[dict], list[dict]]:
    """(complete transactions, every other chain of two spans or more)."""
    df, chains = chain_rows(traces)
    if not chains:
        return [], []
    ts = df["ts_ns"].astype("int64").tolist()
    dur = df["dur_ns"].astype("int64").tolist()
    stage = df["stage"].astype(str).tolist()
    role = (df["role"].astype(str) if "role" in df else df["stage"].astype(str).str.split(".").str[-1]).tolist()
    leg = (df["leg"].fillna("").astype(str) if "leg" in df else pd.Series([""] * len(df))).tolist()
    pid = df["pid"].tolist() if "pid" in df else [None] * len(df)
    txn = df["txn"].tolist() if "txn" in df else [None] * len(df)
    out = [_txn(c, ts, dur, stage, role, leg, pid, txn) for c, complete in chains if complete]
    partial = [_txn(c, ts, dur, stage, role, leg, pid, txn) for c, complete in chains if not complete]
    return out, partial


def _txn(idx, ts, dur, stage, role, leg, pid, txn) -> dict:
    """One chain; `backend_pid` names the server process that served it (through a transaction pooler, any of
    the pool's server connections); `txn` is the transaction number its request carried (the client's)."""
    t0 = ts[idx[0]]
    spans = [{"stage": stage[k], "role": role[k], "leg": leg[k], "start_ns": ts[k] - t0, "dur_ns": dur[k],
              "pid": pid[k]} for k in idx]
    served = next((pid[k] for k in idx if stage[k] == "backend.execute"), None)
    number = next((txn[k] for k in idx if leg[k] == "request" and txn[k] is not None), None)
    return {"spans": spans, "dur_ns": ts[idx[-1]] + dur[idx[-1]] - t0, "t0_ns": t0,
            "backend_pid": int(served) if served is not None else None,
            "txn": int(number) if number is not None and number == number else None}


def pick(txns: list[dict]) -> dict[str, dict]:
    """{'p50': the transaction at the median duration, 'p99': the one at the 99th percentile} (fewer when
    there are too few to tell them apart)."""
    if not txns:
        return {}
    ordered = sorted(txns, key=lambda t: t["dur_ns"])
    n = len(ordered)
    out = {"p50": ordered[(n - 1) // 2]}
    if n >= 2:
        out["p99"] = ordered[min(n - 1, int(round(0.99 * (n - 1))))]
    return out


def _nice_step(span_us: float) -> float:
    for step in (1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 5000, 10000, 20000, 50000):
        if span_us / step <= 10:
            return step
    return 100000


def render(txn: dict, row_order: list[str], title: str, hops: set[str]) -> str:
    """SVG waterfall: one row per process (in path order), one bar per stage, coloured by cause."""
    rows = list(dict.fromkeys([r for r in row_order if any(s["role"] == r for s in txn["spans"])]
                              + [s["role"] for s in txn["spans"]]))
    total_us = max(txn["dur_ns"] / 1e3, 1e-3)
    plot_w = WIDTH - LABEL_W - 20
    scale = plot_w / total_us
    height = 44 + len(rows) * ROW_H + 24
    out = [f'<svg class="pp-waterfall" width="{WIDTH}" height="{height}" '
           f'viewBox="0 0 {WIDTH} {height}" font-family="system-ui,sans-serif" font-size="11" '
           f'data-dur-us="{total_us:.2f}">',
           f'<text x="4" y="16" font-size="13" font-weight="600">{html.escape(title)}</text>']
    step = _nice_step(total_us)
    t = 0.0
    while t <= total_us:
        x = LABEL_W + t * scale
        out.append(f'<line x1="{x:.1f}" y1="26" x2="{x:.1f}" y2="{44 + len(rows) * ROW_H}" stroke="#e5e5e5"/>'
                   f'<text x="{x:.1f}" y="{height - 8}" fill="#666" font-size="10" text-anchor="middle">'
                   f'{t:g} µs</text>')
        t += step
    for i, r in enumerate(rows):
        y = 40 + i * ROW_H
        pid = f" {txn['backend_pid']}" if r == "backend" and txn.get("backend_pid") else ""   # who served it
        out.append(f'<text x="4" y="{y + 16}" font-weight="600" data-pid="{pid.strip()}">{html.escape(r + pid)}</text>')
    for s in txn["spans"]:
        y = 40 + rows.index(s["role"]) * ROW_H
        x, w = LABEL_W + s["start_ns"] / 1e3 * scale, max(s["dur_ns"] / 1e3 * scale, 1.0)
        color = cause_color(qdisc_aware_cause(s["stage"], hops), hops)
        dur_us = s["dur_ns"] / 1e3
        label = f"{s['stage'].split('.')[0]} {dur_us:,.1f}"
        out.append(f'<g class="pp-span" data-element="span" data-stage="{html.escape(s["stage"])}" '
                   f'data-row="{html.escape(s["role"])}" data-leg="{html.escape(s["leg"])}" '
                   f'data-dur-us="{dur_us:.2f}"><title>{html.escape(s["stage"])} [{html.escape(s["leg"])}]: '
                   f'{dur_us:,.2f} µs, at +{s["start_ns"] / 1e3:,.1f} µs</title>'
                   f'<rect x="{x:.1f}" y="{y + 3}" width="{w:.1f}" height="{ROW_H - 6}" fill="{color}" rx="2"/>'
                   + (f'<text x="{x + 3:.1f}" y="{y + 17}" font-size="10" fill="#111">{html.escape(label)}</text>'
                      if w > 7 * len(label) else "") + "</g>")
    out.append("</svg>")
    return "\n".join(out)


def section(traces: pd.DataFrame | None, row_order: list[str], hops: set[str], label: str) -> str:
    """HTML for one run: the p50 and p99 waterfalls with a sentence on what they were picked from, or ''."""
    txns = transactions(traces)
    what = "transaction"
    if txns:
        parts = [f"<p>{html.escape(label)}: {len(txns):,} sampled transactions were complete on every socket of "
                 f"the path; drawn are the one at the median duration and the one at the 99th percentile. Each bar "
                 f"is a stage on the row of the process it belongs to; colours are causes, as in the charts.</p>"]
    else:
        txns = partial_chains(traces)
        if not txns:
            return (f"<p class=\"muted\">{html.escape(label)}: the sampled spans hold no chain of stages to draw."
                    "</p>") if traces is not None and len(traces) else ""
        what = "partial transaction"
        legs = ", ".join(sorted({sp["leg"] for sp in txns[0]["spans"]}))
        parts = [f"<p class=\"caveat\">{html.escape(label)}: no sampled transaction is complete on every socket "
                 f"of the path (each socket counts and samples its own messages, and here they never picked the "
                 f"same one), so these are partial: the {len(txns):,} chains that cover the most of it ({legs}), "
                 f"at their median and 99th-percentile durations.</p>"]
    kinds = {sp["stage"].split(".")[0] for t in txns for sp in t["spans"]}
    if not kinds & {"netfilter", "dev", "qdisc", "delay"}:
        parts.append("<p class=\"muted\">The traces have no spans of their own for netfilter, devices, qdiscs or "
                     "a link's delay line: each <code>wire.*</code> bar includes whatever of those its message "
                     "crossed (the latency view above carves them out).</p>")
    for q, t in pick(txns).items():
        parts.append(render(t, row_order, f"{label}: {q} {what}, {t['dur_ns'] / 1e3:,.1f} µs", hops))
    return "\n".join(parts)
