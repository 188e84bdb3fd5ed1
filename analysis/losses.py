"""Lost and unpaired probe events, said in words: how many, out of how many of the same kind, and what they mean
for the figures. A bare "proc_unpaired=93288" tells a reader nothing; "93,288 of 280,000 sends (33 %) had no
read before them ... the latency view is short by the time before them" tells them whether to trust the run."""
from __future__ import annotations

import pandas as pd
from pathprof.analysis.run_model import Probes

# counter -> (what it is out of, what happened, what it means for the figures)
MEANINGS = {
    "wire_unpaired": ("messages", "arrived without their sender's send start being seen (sent by a thread pathprof "
                      "does not follow, or delivered from another CPU's softirq)",
                      "their wire stage is missing, so the legs are short by about that share of wire.* time"),
    "proc_unpaired": ("sends", "had no read before them to pair with (a server or client sending one message in "
                      "parts, or a hop sending again after it slept without reading)",
                      "the work before those sends is in no stage, so the latency view is short by it (see the "
                      "closure)"),
    "ready_race": ("messages", "were marked ready by two CPUs at once", "none: the first mark starts the message"),
    "dev_overwritten": ("device packets", "had their device stamp replaced before their receive (a dropped "
                        "packet or a slot collision)", "their dev.* time is not counted"),
    "dev_stale": ("device packets", "matched a stale stamp (the skb address reused)",
                  "their dev.* time is not counted"),
    "nf_unpaired": ("netfilter traversals", "left a hook between pathprof's brackets (stolen, dropped, or queued to "
                    "user space by a link's delay line)",
                    "their netfilter time is not counted"),
    "nf_nested_full": ("netfilter traversals", "were a third nested traversal of one hook on a CPU",
                       "they were not timed"),
    "switch_in_unseen": ("context switches of the run's threads", "left a CPU without their switch-in having been "
                         "seen", "their on-CPU time was charged from the CPU's previous switch: approximate"),
    "tasks_full": (None, "threads could not be given probe storage", "they were not followed: the figures miss them"),
    "socks_full": (None, "sockets could not be given probe storage", "their messages are missing"),
    "stages_full": (None, "stage records did not fit their map", "those stages are missing"),
    "cpu_full": (None, "CPU records had no slot (role or hop out of range)", "that CPU time is missing"),
    "hop_overflow": ("latency spans", "had a hop beyond the run's hop slots", "those spans are missing from the "
                     "latency view"),
    "trace_lost": ("sampled spans", "did not fit the ring buffer", "traces.parquet misses them; the figures do not"),
    "recursion_misses": ("probe runs", "were skipped because another BPF program was running on that CPU",
                         "those events are missing"),
}


def _count(n: float) -> str:
    if n >= 1e6:
        return f"{n / 1e6:.1f} M"
    return f"{int(n):,}"


def _pct(part: float, whole: float) -> str:
    p = part / whole * 100.0
    return "<0.1 %" if 0 < p < 0.1 else f"{p:.1f} %"


def denominators(counters: dict, stages: pd.DataFrame | None, cpu: pd.DataFrame | None,
                 run_cnt: int | None) -> dict[str, float]:
    """How many events of each kind the probes saw (paired or not), from the run's own tables."""
    def stage_count(kind: str) -> float:
        if stages is None or not len(stages) or "kind" not in stages:
            return 0.0
        return float(stages.loc[stages.kind == kind, "count"].sum())
    switches = 0.0
    if cpu is not None and len(cpu) and "count" in cpu:
        switches = float(cpu.loc[cpu.comp == "user", "count"].sum())
    msgs = float(counters.get("messages") or 0)
    if not msgs:                          # runs recorded before the counters were kept: the wire stages' count
        msgs = stage_count("wire") + float(counters.get("wire_unpaired") or 0)
    return {"messages": msgs + float(counters.get("piece_late") or 0),
            "sends": stage_count("proc") + float(counters.get("proc_unpaired") or 0),
            "device packets": stage_count("dev") + float(counters.get("dev_overwritten") or 0)
            + float(counters.get("dev_stale") or 0),
            "netfilter traversals": float(counters.get("nf_packets") or 0),
            "context switches of the run's threads": switches,
            "sampled spans": float(counters.get("traces") or 0) + float(counters.get("trace_lost") or 0),
            "probe runs": float(run_cnt or 0)}


def describe(lost: dict, counters: dict, stages: pd.DataFrame | None = None, cpu: pd.DataFrame | None = None,
             run_cnt: int | None = None) -> list[dict]:
    """One item per non-zero loss counter: {name, count, of, of_what, share_pct, text}."""
    whole = denominators({**(lost or {}), **(counters or {})}, stages, cpu, run_cnt)
    out = []
    for name, n in sorted((lost or {}).items(), key=lambda kv: -kv[1]):
        if not n:
            continue
        of_what, what, effect = MEANINGS.get(name, (None, "events were lost", "the figures miss them"))
        of = whole.get(of_what) if of_what else None
        if of and of >= n:
            text = f"{_count(n)} of {_count(of)} {of_what} ({_pct(n, of)}) {what}: {effect} ({name})"
            share = round(n / of * 100.0, 3)
        else:
            text = " ".join(x for x in (_count(n), of_what, what) if x) + f": {effect} ({name})"
            share = None
        out.append({"name": name, "count": int(n), "of": int(of) if of else None, "of_what": of_what,
                    "share_pct": share, "text": text})
    return out


def notes(items: list[dict], run_cnt: int | None) -> list[str]:
    """The report's notes for these items: a total against every event the probes handled, then each."""
    if not items:
        return []
    total = sum(i["count"] for i in items)
    head = f"{_count(total)} probe events were lost or could not be paired"
    if run_cnt and run_cnt >= total:
        head += f", {_pct(total, run_cnt)} of the ≈{_count(run_cnt)} the probes handled"
    return [head + "; each kind, with its share of the events of that kind:"] + [i["text"] for i in items]


def add_to_summary(out: dict, probes: Probes, stages: pd.DataFrame | None, cpu: pd.DataFrame | None) -> None:
    """out["losses"] and the worded notes, in place of the recorder's bare "lost/unpaired events: k=v" note."""
    run_cnt = probes.cost.run_cnt if probes.cost else None
    items = describe(probes.lost or {}, probes.counters or {}, stages, cpu, run_cnt)
    out["losses"] = items
    if items:
        out["notes"] = [n for n in out["notes"] if not n.startswith("lost/unpaired events:")] + notes(items, run_cnt)
