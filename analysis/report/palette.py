"""One stable palette for every chart of every report: a stage or CPU component is coloured by its cause
(analysis.causes), so `queued.docker-proxy` has the same colour in the stacked bars, the waterfall and the next
report, and a legend lists causes (about ten), not stages (thirty)."""
from __future__ import annotations

from pathprof.analysis.causes import cause_of, hop_names

CAUSE_COLORS = {
    "client": "#4e79a7",
    "network stack": "#76b7b2",
    "devices": "#59a14f",
    "netfilter": "#edc948",
    "scheduler": "#f28e2b",
    "backend": "#e15759",
    "connection setup": "#9c755f",
    "link impairment": "#17becf",
    "probes": "#bab0ac",
    "foreign load": "#6b6b6b",
    "other stages": "#d4a6c8",
}
# hops get colours of their own family (purples/pinks), handed out by sorted name so two reports of the same
# hops agree
_HOP_COLORS = ["#b07aa1", "#8c1d40", "#ff9da7", "#7b4fa0", "#d37295"]
CAUSE_ORDER = ["client", "hop", "network stack", "devices", "link impairment", "netfilter", "scheduler", "backend",
               "connection setup", "probes", "foreign load", "other stages"]


def hop_color(hop: str, all_hops: set[str]) -> str:
    ordered = sorted(all_hops | {hop})
    return _HOP_COLORS[ordered.index(hop) % len(_HOP_COLORS)]


def cause_color(cause: str, all_hops: set[str]) -> str:
    if cause.startswith("hop "):
        return hop_color(cause[4:], all_hops)
    return CAUSE_COLORS.get(cause, CAUSE_COLORS["other stages"])


def cause_rank(cause: str) -> int:
    return CAUSE_ORDER.index("hop") if cause.startswith("hop ") else (
        CAUSE_ORDER.index(cause) if cause in CAUSE_ORDER else len(CAUSE_ORDER))


def hops_of(summaries: list) -> set[str]:
    """The hops of these runs (summary documents or analysis.run_model.Summary), from their stage and CPU names."""
    out: set[str] = set()
    for s in summaries:
        out |= hop_names(s)
    return out


def qdisc_aware_cause(name: str, hops: set[str]) -> str:
    """The cause of a stage or component (analysis.causes.cause_of; delay.*/qdisc.* are 'link impairment')."""
    return cause_of(name, hops)
