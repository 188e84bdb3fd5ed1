"""Explaining the gap between two runs, from their summary documents alone.

Everything here is a pure function of DESIGN.md `--json` summaries, so `pathprof diff` a month later prints
what `pathprof compare` printed live. They are read through the typed run model (analysis.run_model.Summary;
a summary dict is accepted and read through it); optional keys may be missing; nothing here raises on a sparse
summary.

Sign conventions (shared with analysis.summary):
- `tps_delta_pct` = (other − baseline) / baseline × 100, so a slower run has a negative value.
- a gap is "other − baseline" in µs per transaction; an item's share is its delta over the gap, so items that
  moved the same way as the gap have positive shares whichever run is faster.
- `closure.cpu_error_pct` = (sum of CPU components − measured CPU per txn) / measured × 100, which lets us
  recover the *measured* CPU per transaction when the summary does not carry it directly.
"""
from __future__ import annotations

import math
from pathlib import Path

from pathprof.analysis.causes import group, hop_names, rank
from pathprof.analysis.client import client_of
from pathprof.analysis.gap import divisor_caveat, divisor_caveat_text
from pathprof.analysis.quota import cause_detail
from pathprof.analysis.run_model import Summary
from pathprof.analysis.speed import MIN_MOVE as SPEED_MIN_MOVE
from pathprof.analysis.speed import cause as speed_cause
from pathprof.analysis.speed import public as speed_public
from pathprof.analysis.speed import residual_items, sampled_ratio, speed_factor, speed_words

# Below this many µs per transaction two runs are "the same" and shares would only amplify noise.
_MIN_GAP_US = 1e-6
# A share beyond this means the measured gap is smaller than its parts: items moved in opposite directions by
# more than the gap itself, and ranking them by share would be ranking noise.
MAX_SHARE_PCT = 150.0
# Without repeats, a TPS gap below this is within what two identical runs differ by on a small machine.
NOISE_TPS_PCT = 5.0
# Foreign CPU (`other`) above this share of the CPU components: the run was limited by someone else's load.
FOREIGN_SHARE = 0.25
# Items smaller than this share are folded into "other stages" in the sentence (the table still lists them).
_SENTENCE_MIN_SHARE = 2.0
_SENTENCE_MAX_ITEMS = 4


def run_label(summary: dict | Summary) -> str:
    """The short name a run goes by in tables and sentences: an explicit label, else its topology."""
    s = Summary.of(summary)
    return str(s.label or s.topology or Path(str(s.run_dir or "run")).name)


def _distinct_label(base: dict | Summary, other: dict | Summary) -> str:
    """Label of `other`, disambiguated when both runs share a topology (diff of two runs, sweeps, repeats)."""
    base, other = Summary.of(base), Summary.of(other)
    label = run_label(other)
    if label != run_label(base):
        return label
    if opens_connections(other) != opens_connections(base):
        return f"{label} ({'new connection per transaction' if opens_connections(other) else 'long connections'})"
    if other.clients != base.clients and other.clients is not None:
        return f"{label} ({other.clients} clients)"
    if other.run_dir:
        return f"{label} ({Path(str(other.run_dir)).name})"
    return f"{label} (other)"


def is_cpu_bound(summary: dict | Summary) -> bool:
    return Summary.of(summary).regime == "cpu-bound"


def _num(value, default: float = 0.0) -> float:
    """A finite float from a JSON value; None/NaN/strings become `default` so sparse summaries still explain."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        return default
    return x if math.isfinite(x) else default


def has_execute_parts(summary: dict | Summary) -> bool:
    """Deep runs with exclusive parts of backend.execute (its waits and I/O + backend.execute.other)."""
    return any(st.part for st in Summary.of(summary).stages)


def _stage_name(name, missing: str = "?") -> str:
    return missing if name is None else str(name)


def stage_totals(summary: dict | Summary, split_execute: bool = False) -> dict[str, float]:
    """µs per transaction per stage name, summed over legs (a hop appears on the request and response leg, and a
    DBA asks about "the docker-proxy hop", not about one of its legs). Parts of a stage (backend.execute's USDT
    split) are not counted again -- unless `split_execute` and the run has exclusive parts: then backend.execute
    is replaced by them (they add up to it), so a gap inside the server is named by its wait or I/O."""
    summary = Summary.of(summary)
    split = split_execute and has_execute_parts(summary)
    out: dict[str, float] = {}
    for st in summary.stages:
        if split and st.part:
            pass
        elif st.parent or (split and st.name == "backend.execute"):
            continue
        name = _stage_name(st.name)
        if split_execute and not split and name == "backend.execute" and summary.probes == "deep":
            name = "backend.execute.other"    # measured, and no wait or I/O happened: every part but this is 0
        out[name] = out.get(name, 0.0) + _num(st.us_per_txn)
    return out


def cpu_totals(summary: dict | Summary) -> dict[str, float]:
    out: dict[str, float] = {}
    for c in Summary.of(summary).cpu:
        name = _stage_name(c.component)
        out[name] = out.get(name, 0.0) + _num(c.us_per_txn)
    return out


def measured_latency_us(summary: dict | Summary) -> float:
    return _num(Summary.of(summary).latency_ms.mean) * 1000.0


def opens_connections(summary: dict | Summary) -> bool:
    s = Summary.of(summary)
    return bool(s.connection_setup) or bool(s.workload.connect)


def connection_totals(summary: dict | Summary) -> dict[str, float]:
    """Connection-setup steps as per-transaction items: with a new connection per transaction, µs per connection
    is µs per transaction. Prefixed `connect.` so a step never merges with a same-named latency stage."""
    out: dict[str, float] = {}
    for step in Summary.of(summary).connection_setup:
        name = _stage_name(step.name)
        name = name if name.startswith("connect.") else f"connect.{name}"
        out[name] = out.get(name, 0.0) + _num(step.us_per_conn)
    return out


def cycle_us(summary: dict | Summary) -> float:
    """Time one client spends per transaction, connection setup and teardown included: clients / TPS. pgbench's
    per-transaction latency starts *after* connecting under -C, so only this measure contains what -C costs."""
    s = Summary.of(summary)
    tps, clients = _num(s.tps), _num(s.clients, default=1.0) or 1.0
    return clients * 1e6 / tps if tps > 0 else 0.0


def measured_cycle_us(summary: dict | Summary) -> float:
    """The cycle the stages were measured against: the in-window one when the run used probe windows (the
    stages come from those windows), else clients / TPS of the whole run."""
    summary = Summary.of(summary)
    c = summary.closure.cycle_us
    return _num(c) if c else cycle_us(summary)


def measured_cpu_us(summary: dict | Summary) -> float:
    """Measured CPU µs per transaction (busy CPU time / transactions), independent of the component sum where the
    summary allows it, so the unexplained remainder means something."""
    summary = Summary.of(summary)
    if summary.cpu_us_per_txn is not None:
        return _num(summary.cpu_us_per_txn)
    busy, tps = _num(summary.busy_cpus), _num(summary.tps)
    if busy > 0 and tps > 0:
        return busy * 1e6 / tps       # busy CPU-seconds per second / transactions per second
    total = sum(cpu_totals(summary).values())
    err = summary.closure.cpu_error_pct
    if err is not None and total and _num(err, default=math.nan) > -100:
        return total / (1.0 + _num(err) / 100.0)
    return total


def limiter(summary: dict | Summary) -> str:
    """What limited a run: "cpu" (its own work saturated the CPUs), "foreign-cpu" (saturated, but a large share
    of the CPU went to processes that are not the run's) or "latency" (CPUs left idle: clients waited)."""
    if not is_cpu_bound(summary):
        return "latency"
    comps = cpu_totals(summary)
    total = sum(comps.values())
    return "foreign-cpu" if total > 0 and comps.get("other", 0.0) / total >= FOREIGN_SHARE else "cpu"


_LIMITER_WORDS = {"cpu": "limited by its own CPU work", "foreign-cpu": "limited by other processes' CPU load",
                  "latency": "latency-bound (CPUs left idle)"}


def choose_basis(baseline: dict | Summary, other: dict | Summary) -> tuple[str, str]:
    """(basis, why). The CPU basis only when both runs were limited by their own CPU work (then TPS = busy CPUs /
    CPU per transaction, and CPU per transaction is what moves throughput); otherwise the latency basis (TPS ≈
    clients / cycle), said plainly when the two runs were limited by different things."""
    la, lb = limiter(baseline), limiter(other)
    if la == lb == "cpu":
        return "cpu", "both runs were limited by their own CPU work"
    if la == lb:
        return "latency", f"both runs were {_LIMITER_WORDS[la]}"
    return "latency", (f"{run_label(baseline)} was {_LIMITER_WORDS[la]} and {_distinct_label(baseline, other)} "
                       f"{_LIMITER_WORDS[lb]}: limited by different things, so the gap is explained by where each "
                       "transaction's time went")


def explain(baseline: dict | Summary, other: dict | Summary, basis: str | None = None,
            noise_pct: float = NOISE_TPS_PCT) -> dict:
    """Why `other`'s TPS differs from `baseline`'s: causes and per-stage or per-component items with their shares.

    The basis is choose_basis()'s unless given. The answer is ranked only when it can be: a gap within the noise,
    or one smaller than its parts (a share beyond ±MAX_SHARE_PCT), is said so instead (`ranked` false, `verdict`);
    on the CPU basis such a gap is tried on the latency basis first.
    """
    why = None
    baseline, other = Summary.of(baseline), Summary.of(other)
    if basis is None:
        basis, why = choose_basis(baseline, other)
    e = _explain_on(baseline, other, basis, noise_pct)
    e["basis_reason"] = why or f"{basis} basis requested"
    if basis == "cpu" and e["verdict"] == "smaller than its parts":
        alt = _explain_on(baseline, other, "latency", noise_pct)
        if alt["ranked"] and abs(alt["gap_us_per_txn"]) > _MIN_GAP_US:
            alt["basis_reason"] = (f"{why or 'cpu basis requested'}, but the CPU gap "
                                   f"({e['gap_us_per_txn']:+.1f} µs) is smaller than its parts; the latency view "
                                   "splits it")
            return alt
    return e


def _totals_and_gap(baseline: Summary, other: Summary, basis: str) -> tuple[dict, dict, float, str, bool]:
    """Each run's per-transaction figures on the basis, the measured gap they must add up to, what that gap is a
    difference of, and whether the backend's execute is split into its parts."""
    # name the server's waits and I/O at the finest split both runs allow: when both were measured deep, a part
    # one run lacks (its backend never waited) is zero there, not a reason to fall back to backend.execute
    both_deep = baseline.probes == "deep" and other.probes == "deep"
    split = (has_execute_parts(baseline) and has_execute_parts(other)) or (
        both_deep and (has_execute_parts(baseline) or has_execute_parts(other)))
    if basis == "cpu":
        # pathprof's own probes are not a cause of the system's gap: out of the items and of the measured gap
        a, b = cpu_totals(baseline), cpu_totals(other)
        pa, pb = a.pop("probes", 0.0), b.pop("probes", 0.0)
        return a, b, (measured_cpu_us(other) - pb) - (measured_cpu_us(baseline) - pa), "cpu_us_per_txn", split
    if opens_connections(baseline) or opens_connections(other):
        a = {**stage_totals(baseline, split), **connection_totals(baseline)}
        b = {**stage_totals(other, split), **connection_totals(other)}
        return a, b, measured_cycle_us(other) - measured_cycle_us(baseline), "client_cycle_us", split
    a, b = stage_totals(baseline, split), stage_totals(other, split)
    if baseline.closure.cycle_us and other.closure.cycle_us:
        # The stages tile each connection's timeline, so the measure they add up to is the cycle (clients/TPS).
        return a, b, measured_cycle_us(other) - measured_cycle_us(baseline), "client_cycle_us", split
    return a, b, measured_latency_us(other) - measured_latency_us(baseline), "mean_latency_us", split


def _explain_on(baseline: Summary, other: Summary, basis: str, noise_pct: float) -> dict:
    a, b, gap, measure, split = _totals_and_gap(baseline, other, basis)
    # A stage present in only one run counts fully (missing = 0 µs), e.g. a hop that only one path has.
    names = list(dict.fromkeys([*a, *b]))
    items = []
    for name in names:
        delta = b.get(name, 0.0) - a.get(name, 0.0)
        share = delta / gap * 100.0 if abs(gap) > _MIN_GAP_US else 0.0
        items.append({"name": name, "delta_us_per_txn": round(delta, 3), "share_pct": round(share, 1)})
    # Ranked by share; ties (e.g. zero gap) fall back to the size of the move so the table still reads sensibly.
    items.sort(key=lambda it: (-it["share_pct"], -abs(it["delta_us_per_txn"])))
    if abs(gap) > _MIN_GAP_US:
        unexplained = (gap - sum(b.get(n, 0.0) - a.get(n, 0.0) for n in names)) / gap * 100.0
    else:
        unexplained = 0.0

    base_tps, other_tps = _num(baseline.tps), _num(other.tps)
    tps_delta = (other_tps - base_tps) / base_tps * 100.0 if base_tps else 0.0
    # one speed ratio shared by every stage's own CPU work is one cause, not a share of each stage's (speed.py)
    factor = speed_factor(a, b, basis, gap if abs(gap) > _MIN_GAP_US else 0.0)
    steal = [(s.doc.get("steal") or {}).get("pct") for s in (baseline, other)]
    if factor and None not in steal:      # a hypervisor's steal stretches every stage alike (analysis.steal)
        factor["steal_pct"] = steal
    # the machine's own speed, sampled through each run: a factor it matches is the machine's, not the path's
    machine = sampled_ratio(baseline.doc.get("host"), other.doc.get("host"))
    if factor and machine:
        factor["machine_ratio"] = round(machine, 3)
    causes = group(residual_items(items, factor), gap if abs(gap) > _MIN_GAP_US else 0.0, hop_names(baseline),
                   hop_names(other))
    for c in causes:      # the client by its program's name: pgbench, or what `attach` found (analysis.client)
        if c["name"] == "client":
            c["process"] = "/".join(dict.fromkeys((client_of(baseline), client_of(other))))
    if factor:
        causes = rank([speed_cause(factor), *causes])
        for it in items:       # the factor's part of each item; the rest of it is its cause's
            if it["name"] in factor["items"]:
                it["speed_us_per_txn"] = round(factor["items"][it["name"]], 3)
    verdict = _verdict(items, causes, gap, tps_delta, noise_pct)
    for c in causes:
        if c["name"] == "cpu quota":      # which cgroup, with what quota (run.json cpu_quotas of either run)
            c["detail"] = cause_detail([baseline.doc, other.doc], c["items"])
    if verdict:                  # not rankable: keep the moves, drop the shares that would mislead
        for row in (*items, *causes):
            row["share_pct"] = None
        items.sort(key=lambda it: -abs(it["delta_us_per_txn"]))
        causes.sort(key=lambda c: -abs(c["delta_us_per_txn"]))
        if factor:
            factor["share_pct"] = None
    return {
        "run": _distinct_label(baseline, other),
        "baseline": run_label(baseline),
        "tps_delta_pct": round(tps_delta, 1),
        "basis": basis,
        "gap_us_per_txn": round(gap, 3),
        "measure": measure,     # what the gap is a difference of; client_cycle_us = clients / TPS, under -C
        "causes": causes,
        "items": items,
        "unexplained_pct": round(unexplained, 1) if not verdict else None,
        "ranked": not verdict,
        "verdict": verdict,
        "speed_factor": speed_public(factor),
        "machine_speed_ratio": round(machine, 3) if machine else None,
        "io_stages": _io_moves(baseline, other) if basis == "cpu" and split else [],
        "divisor_caveats": ([divisor_caveat(s, run_label(s), gap) for s in (baseline, other)
                             if s.closure.connect_divisors] if basis != "cpu" else []),
    }



IO_STAGES = ("backend.wal_flush", "backend.data_read", "backend.dirty_write", "backend.wal_buffers_full")


def _io_moves(baseline: Summary, other: Summary) -> list[dict]:
    """On the CPU basis the server's I/O waits are not what moved throughput (other clients' CPU work filled
    them), but a DBA asking "was it the fsync?" wants them named: their moves in the latency view."""
    a, b = stage_totals(baseline, True), stage_totals(other, True)
    moves = [{"name": n, "delta_us_per_txn": round(b.get(n, 0.0) - a.get(n, 0.0), 3)} for n in IO_STAGES]
    return sorted((m for m in moves if abs(m["delta_us_per_txn"]) >= 1.0), key=lambda m: -abs(m["delta_us_per_txn"]))


def _verdict(items: list[dict], causes: list[dict], gap: float, tps_delta: float, noise_pct: float) -> str | None:
    """Why the gap cannot be ranked, or None when it can."""
    if abs(gap) <= _MIN_GAP_US or not items:
        return None              # nothing to split: the sentence says so
    if abs(tps_delta) < noise_pct:
        return "within noise"
    if noise_pct and tps_delta * gap > 0:
        # slower overall but cheaper per transaction where the stages were measured (or the reverse): the
        # windows and the whole run disagree, which is what noise looks like
        return "within noise"
    # Judged on the causes, which the sentence ranks: stages of one cause may move against each other by more
    # than the gap (a queue moving from a pooler's socket into its pool: queued.pgbouncer down, poolwait up)
    # while the cause's net share is what it claims. The catch-all "other stages" groups unrelated items: those
    # are judged one by one.
    loose = {n for c in causes if c.get("name") == "other stages" for n in c.get("items") or []}
    judged = [c for c in causes if c.get("name") != "other stages"] + [i for i in items if i.get("name") in loose]
    shares = [r["share_pct"] for r in (judged if causes else items) if r.get("share_pct") is not None]
    if any(abs(x) > MAX_SHARE_PCT for x in shares):
        return "smaller than its parts"
    return None


def _item_phrase(name: str) -> str:
    """`hop.docker-proxy` reads as "the docker-proxy hop"; other names are already what the README documents."""
    if name.startswith("hop."):
        return f"the {name[4:]} hop"
    if name.startswith("connect."):
        return f"{name[8:]} (connection setup)"
    return name


def _cause_phrase(cause: dict) -> str:
    name = str(cause.get("name", "?"))
    if name == "cpu speed" and cause.get("ratio") is not None:   # its band and origins: the report's speed line
        return f"every stage's own CPU work {speed_words(_num(cause['ratio']))} (× {_num(cause['ratio']):.2f})"
    if name.startswith("hop "):
        hop = name[4:]
        extra = [i for i in cause.get("items") or [] if not (str(i).startswith("hop.") or str(i).endswith("." + hop))]
        return f"the {hop} hop" + (" (with the network work of its second connection)" if extra else "")
    if name == "cpu quota":
        return "the CPU quota" + (f" of {cause['detail']}" if cause.get("detail") else " of a cgroup")
    return {"scheduler": "the scheduler", "backend": "the backend", "backend I/O": "the server's I/O",
            "client": f"the client ({cause.get('process') or 'pgbench'})",
            "network stack": "the network stack", "devices": "the device path",
            "foreign load": "other processes' CPU load", "probes": "pathprof's probes",
            "link impairment": "the delay or rate limit put on the link"}.get(name, name)


def _fmt_pct(x: float) -> str:
    x = x + 0.0  # turns -0.0 into 0.0 so a sentence never says "-0 %"
    if abs(x) < 0.05:
        return "0 %"
    return f"{x:.0f} %" if abs(x) >= 1 or x == 0 else f"{x:.1f} %"


def explain_text(expl: dict) -> str:
    """One sentence a DBA can repeat, causes first, e.g. "docker-dnat is 60 % slower than docker-bridge; the
    docker-proxy hop (with the network work of its second connection) causes 99 % of that (+45.0 µs CPU per
    transaction), 0.9 % unexplained". With `real_gap` set (by compare --repeat, from is_real_gap) the sentence
    also says whether the gap stands out of the noise."""
    text = _explain_sentence(expl)
    io = expl.get("io_stages") or []
    if io:
        text += ("; the server's I/O waits moved too (latency view: "
                 + ", ".join(f"{m['name']} {_num(m['delta_us_per_txn']):+,.1f}" for m in io[:3])
                 + " µs per transaction), hidden behind the other clients' CPU work")
    for c in expl.get("divisor_caveats") or []:
        text += "; " + divisor_caveat_text(c)
    m = expl.get("machine_speed_ratio")
    if m and abs(_num(m) - 1.0) >= SPEED_MIN_MOVE and not expl.get("speed_factor"):
        # no common factor in the stages, yet the machine itself moved: the gap may hold the machine's drift
        text += (f"; the machine itself ran {speed_words(_num(m))} at {expl.get('run', 'this run')} than at "
                 f"{expl.get('baseline', 'the baseline')} (its speed sampled through each run): part of the gap may be "
                 "the machine's, not the path's")
    if expl.get("real_gap") is True:
        return text + " (the gap exceeds the run-to-run spread)"
    if expl.get("real_gap") is False:
        return text + " (but the gap is within the run-to-run spread: treat it as noise)"
    return text


def _explain_sentence(expl: dict) -> str:
    run, base = expl.get("run", "run"), expl.get("baseline", "the baseline")
    tps_delta = _num(expl.get("tps_delta_pct"))
    gap = _num(expl.get("gap_us_per_txn"), default=math.nan)
    unit = "µs CPU per transaction" if expl.get("basis") == "cpu" else "µs per transaction"
    if abs(tps_delta) < 0.5 and (math.isnan(gap) or abs(gap) <= _MIN_GAP_US):
        return f"{run} is as fast as {base} ({tps_delta:+.1f} % TPS); there is no gap to explain"
    if abs(tps_delta) < 0.5:
        # Same throughput but a different cost (e.g. latency-bound at equal client counts): name the cost instead.
        head = f"{run} runs at the same TPS as {base} but costs {gap:+.1f} {unit}"
    else:
        head = f"{run} is {abs(tps_delta):.0f} % {'slower' if tps_delta < 0 else 'faster'} than {base}"
    if not math.isnan(gap) and abs(gap) <= _MIN_GAP_US:
        what = "CPU" if expl.get("basis") == "cpu" else "mean latency"
        return f"{head}, but its {what} per transaction is unchanged, so there is nothing to split"

    items = expl.get("items") or []
    if not items:
        what = "component" if expl.get("basis") == "cpu" else "stage"
        return f"{head}; these runs have no per-{what} figures to split it (were probes off?)"
    moves = ", ".join(f"{it['name']} {_num(it['delta_us_per_txn']):+,.1f}" for it in items[:3])
    if expl.get("verdict") == "within noise" and expl.get("real_gap") is not True:
        why = (f"within what two identical runs differ by here (< {NOISE_TPS_PCT:g} % TPS)"
               if abs(tps_delta) < NOISE_TPS_PCT else
               "noise: where the stages were measured the gap points the other way")
        return (f"{head}, which is {why}: not ranked (repeat the runs with --repeat to tell); the largest moves "
                f"were {moves} {unit}")
    if expl.get("verdict") == "smaller than its parts":
        return (f"{head}, but the measured gap ({gap:+,.1f} {unit}) is smaller than its parts ({moves}): they "
                "moved in opposite directions by more than the gap, so they are not ranked")
    causes = [c for c in expl.get("causes") or [] if c.get("share_pct") is not None]
    shown = [c for c in causes if _num(c["share_pct"]) >= _SENTENCE_MIN_SHARE][:_SENTENCE_MAX_ITEMS]
    parts = []
    for i, c in enumerate(shown):
        if i == 0:
            # an item's part in its cause: its delta less what a common speed factor took of it
            delta = {it["name"]: _num(it["delta_us_per_txn"]) - _num(it.get("speed_us_per_txn")) for it in items}
            under = [] if c.get("ratio") is not None else sorted(
                (n for n in c.get("items") or [] if abs(delta.get(n, 0.0)) >= 0.05), key=lambda n: -abs(delta[n]))[:3]
            detail = (": " + ", ".join(f"{n} {delta[n]:+,.1f}" for n in under)) if len(under) > 1 else ""
            parts.append(f"{_cause_phrase(c)} causes {_fmt_pct(_num(c['share_pct']))} of that "
                         f"({_num(c['delta_us_per_txn']):+,.1f} {unit}{detail})")
        else:
            parts.append(f"{_cause_phrase(c)} {_fmt_pct(_num(c['share_pct']))}")
    rest = [c for c in causes if c not in shown and abs(_num(c.get("share_pct"))) >= 0.5]
    if rest:
        rest_share = sum(_num(c.get("share_pct")) for c in rest)
        parts.append(f"{_fmt_pct(rest_share)} {len(rest)} other {'cause' if len(rest) == 1 else 'causes'}")
    parts.append(f"{_fmt_pct(_num(expl.get('unexplained_pct')))} unexplained")
    if not shown:
        # Nothing dominates: say so rather than inventing a culprit.
        return f"{head}; no single cause accounts for it: " + ", ".join(parts)
    return f"{head}; " + ", ".join(parts)
