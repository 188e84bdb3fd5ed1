"""The HTML report's matplotlib figures. Stages and CPU components are grouped by cause (analysis.causes) and
coloured from the one palette of analysis.report.palette, so a legend has about ten entries, not thirty, and a cause has
the same colour in every figure; with `--repeat` the throughput chart shows each configuration's spread.

Figures are drawn on `matplotlib.figure.Figure` objects directly (Agg canvas, no pyplot), so nothing here touches
global backend state and the CLI can call it from any thread. PNGs carry no timestamp metadata, so the same run
directory gives byte-identical files.
"""
from __future__ import annotations

import io

from matplotlib.figure import Figure
from matplotlib.patches import Patch
from pathprof.analysis.explain import _distinct_label, _num, connection_totals, cpu_totals, run_label
from pathprof.analysis.report.palette import cause_color, cause_rank, hops_of, qdisc_aware_cause
from pathprof.analysis.run_model import Summary

LEG_ORDER = ("request", "server", "response", "client")
_RUN_COLORS = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f"]


class RunColors:
    """Colours for runs (not causes), handed out in order of first use within one report."""

    def __init__(self) -> None:
        self.assigned: dict[str, str] = {}

    def __call__(self, name: str) -> str:
        if name not in self.assigned:
            self.assigned[name] = _RUN_COLORS[len(self.assigned) % len(_RUN_COLORS)]
        return self.assigned[name]


def labels(summaries: list[dict | Summary]) -> list[str]:
    """Distinct axis labels: a sweep or repeats share a topology, and matplotlib would stack same-named bars."""
    summaries = [Summary.of(s) for s in summaries]
    out = [run_label(s) for s in summaries]
    if len(set(out)) < len(out):
        if len({s.clients for s in summaries}) == len(summaries):       # a sweep
            out = [f"{lb} ({s.clients} cl.)" for lb, s in zip(out, summaries)]
        else:                                                                    # e.g. -C against long connections
            out = out[:1] + [_distinct_label(summaries[0], s) for s in summaries[1:]]
    if len(set(out)) < len(out):
        out = [f"{lb} #{i + 1}" for i, lb in enumerate(out)]
    return out


def png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})
    return buf.getvalue()


def stage_groups(s: dict | Summary, hops: set[str]) -> dict[tuple[str, str], float]:
    """(leg, cause) -> µs per transaction, legs in path order and causes in palette order within a leg;
    connection setup (-C) last, as its own group."""
    s = Summary.of(s)
    acc: dict[tuple[str, str], float] = {}
    for st in s.stages:
        if st.parent:
            continue
        leg = st.leg or "other"
        key = (leg, qdisc_aware_cause(str(st.name), hops))
        acc[key] = acc.get(key, 0.0) + _num(st.us_per_txn)
    for name, us in connection_totals(s).items():
        acc[("connection", "connection setup")] = acc.get(("connection", "connection setup"), 0.0) + us
    rank = {leg: i for i, leg in enumerate(LEG_ORDER)}
    return dict(sorted(acc.items(), key=lambda kv: (rank.get(kv[0][0], len(rank)), cause_rank(kv[0][1]), kv[0][1])))


def cpu_groups(s: dict | Summary, hops: set[str]) -> dict[str, float]:
    acc: dict[str, float] = {}
    for name, us in cpu_totals(s).items():
        c = qdisc_aware_cause(name, hops)
        acc[c] = acc.get(c, 0.0) + us
    return dict(sorted(acc.items(), key=lambda kv: (cause_rank(kv[0]), kv[0])))


def _legend(ax, causes: list[str], hops: set[str]) -> None:
    handles = [Patch(facecolor=cause_color(c, hops), label=c) for c in dict.fromkeys(causes)]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False,
              title="cause", title_fontsize=8)


def stages_figure(summaries: list[dict]) -> Figure | None:
    """One bar per run; segments are (leg, cause) groups in path order, coloured by cause, legend by cause;
    each leg's extent is marked above the bar."""
    hops = hops_of(summaries)
    per_run = [stage_groups(s, hops) for s in summaries]
    if not any(per_run):
        return None
    fig = Figure(figsize=(9, 1.5 + 0.65 * len(summaries)))
    ax = fig.add_subplot()
    names = labels(summaries)
    causes = []
    widest = max(sum(g.values()) for g in per_run) or 1.0

    def leg_label(y, start, end, leg):   # only where the leg is wide enough for its name
        if end - start >= 0.08 * widest:
            ax.text((start + end) / 2, y - 0.42, leg, ha="center", va="bottom", fontsize=7, color="#555")
    for y, groups in enumerate(per_run):
        left, leg_start, cur_leg = 0.0, 0.0, None
        for (leg, cause), us in groups.items():
            if leg != cur_leg:
                if cur_leg is not None:
                    leg_label(y, leg_start, left, cur_leg)
                cur_leg, leg_start = leg, left
            ax.barh(y, us, left=left, color=cause_color(cause, hops), edgecolor="white", linewidth=0.6)
            left += us
            causes.append(cause)
        if cur_leg is not None:
            leg_label(y, leg_start, left, cur_leg)
    ax.set_yticks(range(len(summaries)), names)
    ax.set_ylim(len(summaries) - 0.5, -0.75)
    ax.set_xlabel("µs per transaction (bars read left to right as the path: request, server, response, client)")
    ax.set_title("Latency per transaction by leg and cause", loc="left")
    _legend(ax, sorted(set(causes), key=lambda c: (cause_rank(c), c)), hops)
    return fig


def cpu_figure(summaries: list[dict]) -> Figure | None:
    hops = hops_of(summaries)
    per_run = [cpu_groups(s, hops) for s in summaries]
    if not any(per_run):
        return None
    fig = Figure(figsize=(9, 1.2 + 0.55 * len(summaries)))
    ax = fig.add_subplot()
    names = labels(summaries)
    causes = []
    for y, groups in enumerate(per_run):
        left = 0.0
        for cause, us in groups.items():
            ax.barh(y, us, left=left, color=cause_color(cause, hops), edgecolor="white", linewidth=0.6)
            left += us
            causes.append(cause)
    ax.set_yticks(range(len(summaries)), names)
    ax.invert_yaxis()
    ax.set_xlabel("CPU µs per transaction")
    ax.set_title("CPU per transaction by cause", loc="left")
    _legend(ax, sorted(set(causes), key=lambda c: (cause_rank(c), c)), hops)
    return fig


def cdf_figure(samples: dict[str, list[float]], color: RunColors) -> Figure | None:
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


def tps_figure(summaries: list[dict], color: RunColors, repeats: list[list[dict]] | None = None) -> Figure | None:
    """Measured TPS per run (the median repeat when there are repeats, with every repeat as a dot and the
    min–max spread as an error bar) and the model's prediction."""
    if len(summaries) < 2:
        return None
    fig = Figure(figsize=(9, 3.5))
    ax = fig.add_subplot()
    names = labels(summaries)
    xs = list(range(len(summaries)))
    summaries = [Summary.of(s) for s in summaries]
    tps = [_num(s.tps) for s in summaries]
    ax.bar(xs, tps, color=[color(run_label(s)) for s in summaries], label="measured")
    if repeats and any(len(r) > 1 for r in repeats):
        for x, runs, mid in zip(xs, repeats, tps):
            vals = [_num(Summary.of(r).tps) for r in runs]
            if len(vals) > 1:
                ax.errorbar([x], [mid], yerr=[[mid - min(vals)], [max(vals) - mid]], color="black", capsize=6,
                            linewidth=1)
                ax.scatter([x] * len(vals), vals, s=12, color="#333", zorder=4)
        ax.errorbar([], [], yerr=[], color="black", capsize=6, linewidth=1, label="repeats: min–max, each run a dot")
    pred = [s.predicted_tps for s in summaries]
    if any(p is not None for p in pred):
        ax.scatter(xs, [_num(p, default=float("nan")) for p in pred], marker="_", s=600, color="black",
                   label="predicted by the model", zorder=3)
    ax.set_xticks(xs, names)
    ax.set_ylabel("TPS")
    ax.set_title("Throughput" + (" (median of the repeats)" if repeats else ""), loc="left")
    ax.legend(fontsize=8, frameon=False)
    ax.tick_params(axis="x", labelrotation=20)
    return fig


def _predicted_curve(ax, pts: list[dict]) -> None:
    """The first run's predictions (pathprof predict) with their band, next to the measured curve."""
    pred = [(p["clients"], p["predicted_from_first"]) for p in pts
            if (p.get("predicted_from_first") or {}).get("tps") is not None]
    if not pred:
        return
    ax.plot([c for c, _ in pred], [r["tps"] for _, r in pred], linestyle="--", marker="x", color="#59a14f",
            label="predicted from the first run")
    ax.fill_between([c for c, _ in pred], [r["tps_low"] for _, r in pred], [r["tps_high"] for _, r in pred],
                    color="#59a14f", alpha=0.15, linewidth=0)
    ax.plot([c for c, _ in pred], [_num(r.get("measured_tps")) for _, r in pred], linestyle="none", marker="o",
            markerfacecolor="none", color="#59a14f", label="measured without probes")


def sweep_figure(sweep: dict) -> Figure | None:
    pts = (sweep or {}).get("points") or []
    if len(pts) < 2:
        return None
    fig = Figure(figsize=(9, 4))
    ax = fig.add_subplot()
    xs = [p["clients"] for p in pts]
    ax.plot(xs, [p["tps"] for p in pts], marker="o", color="#4e79a7", label="TPS")
    spread = [p for p in pts if p.get("tps_min") is not None]
    if spread:   # a sweep with repeats: each point's slowest-to-fastest run as a bar, every run as a dot
        ax.errorbar([p["clients"] for p in spread], [p["tps"] for p in spread],
                    yerr=[[p["tps"] - p["tps_min"] for p in spread], [p["tps_max"] - p["tps"] for p in spread]],
                    fmt="none", ecolor="#4e79a7", capsize=5, linewidth=1)
        for p in spread:
            runs = p.get("tps_runs") or []
            ax.plot([p["clients"]] * len(runs), runs, linestyle="none", marker=".", color="#333",
                    label="repeats: each run (bar: min–max)" if p is spread[0] else "_nolegend_")
    _predicted_curve(ax, pts)
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel("clients")
    ax.set_ylabel("TPS")
    ax2 = ax.twinx()
    ax2.plot(xs, [_num((p.get("latency_ms") or {}).get("mean")) for p in pts], marker="s", color="#e15759",
             label="mean latency (ms)")
    ax2.set_ylabel("mean latency (ms)")
    lines = [ln for ln in ax.get_lines() + ax2.get_lines() if not ln.get_label().startswith("_")]
    ax.legend(lines, [ln.get_label() for ln in lines], loc="upper left", fontsize=8, frameon=False)
    if sweep.get("knee_clients") is not None:
        ax.axvline(sweep["knee_clients"], color="#999", linestyle="--", linewidth=1)
        ax.annotate("knee", (sweep["knee_clients"], ax.get_ylim()[1]), ha="left", va="top", fontsize=9)
    ax.set_title(f"Sweep: {sweep.get('topology')}", loc="left")
    return fig
