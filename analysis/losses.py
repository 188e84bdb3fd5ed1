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
                      "their wire stage is missing (about that share of wire.* time)"),
    "proc_unpaired": ("sends", "had no read before them to pair with (a hop sending again after it slept without "
                      "reading, or a read the probes did not see)",
                      "the work before those sends may be in no stage"),
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
            "sends": stage_count("proc") + float(counters.get("proc_unpaired") or 0)
            + float(counters.get("relay_sent") or 0),
            "device packets": stage_count("dev") + float(counters.get("dev_overwritten") or 0)
            + float(counters.get("dev_stale") or 0),
            "netfilter traversals": float(counters.get("nf_packets") or 0),
            "context switches of the run's threads": switches,
            "sampled spans": float(counters.get("traces") or 0) + float(counters.get("trace_lost") or 0),
            "probe runs": float(run_cnt or 0)}


def reply_parts(counters: dict, stages: pd.DataFrame | None) -> int:
    """Of the sends with no read before them (proc_unpaired), those that were later parts of one message: a
    reply sent in parts (a 2 MB result is some 260 sends) has one read before its first send only, and the work
    between its parts is timed from piece to piece (probes/stall.bpf.h), so they are not unpaired work.

    The probes count messages' pieces, not which send was whose, so this is what the counts allow: the messages
    begun (deliveries less the further pieces, `piece_more`) each began with one send; the paired sends among
    them are at least the sender spans less the spans timed between pieces (at most one per further piece). So
    at most `begun − paired` sends began a message unpaired, and the other unpaired sends were later parts. A hop
    relaying a reply in parts forwards each later part without a proc span (`relay_sent`): paired as well."""
    unpaired = int(counters.get("proc_unpaired") or 0)
    more = int(counters.get("piece_more") or 0)
    if not unpaired or not more or stages is None or not len(stages) or "kind" not in stages:
        return 0
    def count(kind: str) -> int:
        return int(stages.loc[stages.kind == kind, "count"].sum())
    begun = count("wire") + int(counters.get("wire_unpaired") or 0) - more
    # a hop's forwards of a reply's later parts (relay_sent) began messages too, with no proc span of their own
    paired_first = max(count("proc") + int(counters.get("relay_sent") or 0) - more, 0)
    began_unpaired = min(max(begun - paired_first, 0), unpaired)
    return unpaired - began_unpaired


def describe(lost: dict, counters: dict, stages: pd.DataFrame | None = None, cpu: pd.DataFrame | None = None,
             run_cnt: int | None = None) -> list[dict]:
    """One item per non-zero loss counter: {name, count, of, of_what, share_pct, text}; proc_unpaired without the
    later parts of messages sent in parts (reply_parts: `parts` on its item, said in its text)."""
    whole = denominators({**(lost or {}), **(counters or {})}, stages, cpu, run_cnt)
    parts = reply_parts({**(lost or {}), **(counters or {})}, stages)
    out = []
    for name, n in sorted((lost or {}).items(), key=lambda kv: -kv[1]):
        if name == "proc_unpaired" and parts:
            n -= parts
            if not n:
                out.append({"name": name, "count": 0, "parts": parts, "pieces": _pieces(counters),
                            "of": int(whole["sends"]), "of_what": "sends", "share_pct": 0.0,
                            "text": _parts_text(parts, _pieces(counters))})
                continue
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
        item = {"name": name, "count": int(n), "of": int(of) if of else None, "of_what": of_what,
                "share_pct": share, "text": text}
        if name == "proc_unpaired" and parts:   # what is left is a bound (reply_parts): said as one
            item.update(parts=parts, pieces=_pieces(counters),
                        text="at most " + text + "; " + _parts_text(parts, _pieces(counters)))
        out.append(item)
    return out


def _pieces(counters: dict) -> int:
    return int(counters.get("piece_more") or 0)


def _parts_text(parts: int, pieces: int) -> str:
    return (f"{_count(parts)} further sends were later parts of messages sent in parts ({_count(pieces)} further "
            "pieces arrived): their work is timed between the pieces, not unpaired")


def notes(items: list[dict], run_cnt: int | None) -> list[str]:
    """The report's notes for these items: a total against every event the probes handled, then each."""
    if not items:
        return []
    total = sum(i["count"] for i in items)
    if not total:          # only later parts of messages sent in parts: nothing lost
        return [i["text"] for i in items]
    head = f"{_count(total)} probe events were lost or could not be paired"
    if run_cnt and run_cnt >= total:
        head += f", {_pct(total, run_cnt)} of the ≈{_count(run_cnt)} the probes handled"
    return [head + "; each kind, with its share of the events of that kind:"] + [i["text"] for i in items]


# what each kind could cost: the view it would leave short and the stage kind whose mean time one event stands for
# (None: its time is not known); kinds not here cost no time (a race resolved, a trace span not kept)
COSTS = {"wire_unpaired": ("latency", "wire"), "proc_unpaired": ("latency", "proc"),
         "dev_overwritten": ("latency", "dev"), "dev_stale": ("latency", "dev"),
         "nf_unpaired": ("latency", "netfilter"),
         "nf_nested_full": ("latency", "netfilter"), "hop_overflow": ("latency", None),
         "tasks_full": ("latency", None), "socks_full": ("latency", None), "stages_full": ("latency", None),
         "recursion_misses": ("latency", None), "switch_in_unseen": ("cpu", None), "cpu_full": ("cpu", None)}


def _mean_us(stages: pd.DataFrame | None, kind: str) -> float | None:
    if stages is None or not len(stages) or "kind" not in stages:
        return None
    rows = stages[stages.kind == kind]
    n = float(rows["count"].sum()) if len(rows) else 0.0
    return float(rows["sum_ns"].sum()) / n / 1e3 if n else None


def against_closure(items: list[dict], out: dict, stages: pd.DataFrame | None) -> None:
    """Each loss with the time it could cost per transaction (its events × the mean of their stage) and what the
    view's closure says of it: a view that closes cannot be short by more than its shortfall, so a note never
    claims a loss the closure shows did not happen. `cost_us_per_txn`, `closure_short_us_per_txn` on the item."""
    closure, txns = out.get("closure") or {}, (out.get("closure") or {}).get("txns")
    for item in items:
        view, kind = COSTS.get(item["name"], (None, None))
        if view is None or not item["count"]:
            continue
        mean = _mean_us(stages, kind) if kind else None
        cost = round(item["count"] * mean / txns, 1) if mean is not None and txns else None
        err = closure.get(f"{view}_error_pct")
        whole = closure.get("cycle_us") if view == "latency" else out.get("cpu_us_per_txn")
        item["cost_us_per_txn"] = cost
        could = (f"they could cost up to {cost:,.1f} µs per transaction" if cost is not None
                 else "their time is not known")
        # the later parts of messages sent in parts (if any) are said last: the cost is the unpaired sends'
        parts = "; " + _parts_text(item["parts"], item["pieces"]) if item.get("parts") else ""
        item["text"] = item["text"][:len(item["text"]) - len(parts)] if parts else item["text"]
        if err is None or not whole:
            item["text"] += f"; {could} (the {view} view has no closure to check it against){parts}"
            continue
        short = round(max(0.0, -float(err)) / 100.0 * float(whole), 1)
        item["closure_short_us_per_txn"] = short
        unit = "CPU µs" if view == "cpu" else "µs"
        verdict = (f"the {view} view closes at {float(err):+.2f} %, so it is not short by them" if short == 0 else
                   f"the {view} view closes at {float(err):+.2f} %: at most {short:,.1f} {unit} per transaction "
                   "is missing from it, so they cost no more than that")
        item["text"] += f"; {could}: {verdict}{parts}"


def add_to_summary(out: dict, probes: Probes, stages: pd.DataFrame | None, cpu: pd.DataFrame | None) -> None:
    """out["losses"] and the worded notes, in place of the recorder's bare "lost/unpaired events: k=v" note; called
    once the views are made, so each loss is checked against their closure (against_closure)."""
    run_cnt = probes.cost.run_cnt if probes.cost else None
    items = describe(probes.lost or {}, probes.counters or {}, stages, cpu, run_cnt)
    against_closure(items, out, stages)
    out["losses"] = items
    if items:
        out["notes"] = [n for n in out["notes"] if not n.startswith("lost/unpaired events:")] + notes(items, run_cnt)
