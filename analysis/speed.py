"""A common speed factor (#35.2): one cause where every stage's own CPU work ran faster or slower by one ratio.

A CPU that never idles (foreign load beside a 1-client run), another frequency, warmer caches or another kernel
change the speed of *all* on-CPU work at once: `backend.execute`, `client.<client>`, the network stack's `wire.*`,
the devices, every hop's processing all shrink by about the same ratio. Split stage by stage that one change
reads as five causes (backend, client, network stack, devices, scheduler), each a share of the gap. So before the
items are grouped into causes, the ratio of each own-work item (other / baseline) is taken; when those ratios
agree — their interquartile band is narrow and lies on one side of 1 — their median is a common factor, its part
of every own-work item (baseline × (factor − 1)) is the cause "cpu speed", and only what remains of each item goes
to its usual cause. A speed moves the processes' own code and the kernel's network work alike, where a change of
path (TCP instead of a unix socket, a NAT rule) moves only the kernel's: so the factor must show in both groups
(their medians beyond MIN_MOVE on the same side), or it is the path, not the CPU. Waits (wakeups, idle exits, run
queues, queues behind other work, I/O, locks, pool waits, retransmissions, delays) are not own work: a factor
never touches them. One stage moving alone leaves the median at ~1, and two groups of stages moving by different
ratios spread the band: no factor.

Pure functions of two runs' per-stage (latency basis) or per-component (CPU basis) totals."""
from __future__ import annotations

import statistics

from pathprof.analysis.steal import NOTE_PCT as STEAL_NOTE_PCT

# Latency view: stages that are a process's or the kernel's own CPU work between two events on one CPU. Not
# recv.* (switched in -> the receive returned): its work is a few µs of copying, but on a CPU just out of idle it
# is tens of µs more (a 1-client nic run alone: recv.pgbench 80 µs, beside busy loops 2 µs), the scheduler's.
_OWN_KINDS = ("wire.", "dev.", "netfilter.", "hop.", "client.")
_OWN_NAMES = ("backend.execute", "backend.execute.other", "softirq.net")
# CPU view: every component is CPU time; these are not the run's own work at the speed of its CPU: other
# processes' load, pathprof's probes (left out of a CPU gap anyway), and idle CPUs waking (a count of idle
# periods times their exit cost, which changes with how often CPUs idle, not with how fast they run).
_NOT_OWN_CPU = ("other", "probes", "idle.wakeups")

# An item below this (µs per transaction, in either run) has a ratio made of noise: it is scaled when a factor
# is found, but it does not vote for one.
MIN_VOTE_US = 0.5
# Fewer own-work items than this and a median is no evidence of a common factor.
MIN_STAGES = 4
# The factor must move work by at least this much (|ratio − 1|) to be named at all ...
MIN_MOVE = 0.10
# ... and the items must agree: interquartile band no wider than this share of the median, and not including 1.
# Not one exact ratio: a CPU that never idles ran the processes' own code ~2x faster and the kernel's network work
# ~1.25x (nic, 1 client, alone vs beside busy loops, 2026-11-27: bands 0.54-0.73 and 0.56-0.82 around medians of
# 0.63 and 0.71, widths 30 % and 37 % of them); two groups of stages moving 0.45 and 0.95 spread it to 70 %.
MAX_BAND = 0.5

CAUSE = "cpu speed"
# what moves every stage's own work at once, by direction: CPUs that never idle run warm (no deep idle state to
# leave, caches and frequency kept up: foreign load beside a 1-client run made it 35 % faster, #35); CPUs shared
# with other work run cold (caches and TLBs refilled after the other work, a sibling thread's load)
WHY = {"faster": "CPU idle states, frequency, cache warmth, or another kernel",
       "slower": "CPU caches or frequency shared with other work, idle states, or another kernel"}


def _group(name: str, basis: str) -> str:
    """"process" (a process's own code: backend.execute, client.*, hop.*; CPU view: *.user) or "kernel" (the
    network stack, devices, netfilter; CPU view: *.sys, softirq.net, netfilter)."""
    if basis == "cpu":
        return "process" if name.endswith(".user") else "kernel"
    return "kernel" if name.startswith(("wire.", "dev.", "netfilter.", "softirq.")) else "process"


def own_work(name: str, basis: str) -> bool:
    """Whether an item is on-CPU work whose duration scales with the speed of the CPU it ran on."""
    if basis == "cpu":
        return name not in _NOT_OWN_CPU
    return name.startswith(_OWN_KINDS) or name in _OWN_NAMES


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, median, q3


def speed_factor(a: dict[str, float], b: dict[str, float], basis: str, gap: float) -> dict | None:
    """{ratio, low, high, stages_n, delta_us_per_txn, delta_low_us_per_txn, delta_high_us_per_txn, share_pct,
    items {name: us removed from it}, ratios {name: ratio}} when the own-work items of `a` (baseline) and `b`
    share one speed ratio, else None. `low`/`high` are the ratios' interquartile band; the delta's low/high are
    the factor's part at those ends."""
    both = [n for n in a if n in b and own_work(n, basis) and a[n] > 0 and b[n] > 0]
    voters = {n: b[n] / a[n] for n in both if a[n] >= MIN_VOTE_US and b[n] >= MIN_VOTE_US}
    if len(voters) < MIN_STAGES:
        return None
    low, ratio, high = _quartiles(sorted(voters.values()))
    if abs(ratio - 1.0) < MIN_MOVE or low <= 1.0 <= high or (high - low) > MAX_BAND * ratio:
        return None
    for group in ("process", "kernel"):       # both moved, the same way: the CPU, not the path
        moved = [r for n, r in voters.items() if _group(n, basis) == group]
        if not moved or (statistics.median(moved) - 1.0) * (1.0 if ratio > 1.0 else -1.0) < MIN_MOVE:
            return None
    base = sum(a[n] for n in both)
    delta = base * (ratio - 1.0)
    return {"ratio": round(ratio, 3), "low": round(low, 3), "high": round(high, 3), "stages_n": len(voters),
            "delta_us_per_txn": round(delta, 3),
            "delta_low_us_per_txn": round(base * (low - 1.0), 3),
            "delta_high_us_per_txn": round(base * (high - 1.0), 3),
            "share_pct": round(delta / gap * 100.0, 1) if gap else None,
            "items": {n: a[n] * (ratio - 1.0) for n in both},
            "ratios": {n: round(r, 3) for n, r in sorted(voters.items())}}


def residual_items(items: list[dict], factor: dict | None) -> list[dict]:
    """The items with the factor's part taken out of each own-work item's delta (what goes to its usual cause);
    the items themselves unchanged when there is no factor."""
    if not factor:
        return items
    scaled = factor["items"]
    return [dict(it, delta_us_per_txn=it["delta_us_per_txn"] - scaled.get(it["name"], 0.0)) for it in items]


def cause(factor: dict) -> dict:
    """The factor as a row of `causes`: its delta and share, the items it scaled, and its ratio and band."""
    return {"name": CAUSE, "delta_us_per_txn": factor["delta_us_per_txn"], "share_pct": factor["share_pct"],
            "items": sorted(factor["items"]), "ratio": factor["ratio"], "low": factor["low"],
            "high": factor["high"], "stages_n": factor["stages_n"]}


def public(factor: dict | None) -> dict | None:
    """The explanation's `speed_factor` field: the factor without its per-item split (kept in the items)."""
    if not factor:
        return None
    return {k: v for k, v in factor.items() if k != "items"}


def speed_words(ratio: float) -> str:
    """"35 % faster" for a ratio of 0.65 (work took 0.65 of its time), "20 % slower" for 1.2."""
    pct = abs(1.0 - ratio) * 100.0
    return f"{pct:.0f} % {'faster' if ratio < 1.0 else 'slower'}"


def speed_phrase(factor: dict) -> str:
    """One line: what the factor is, its band, and what it may come from."""
    why = WHY["faster" if factor["ratio"] < 1.0 else "slower"]
    machine = factor.get("machine_ratio")
    if machine:             # the machine's own speed sampled through each run: the machine's or the path's
        mine = (machine - 1.0) * (factor["ratio"] - 1.0) > 0 and abs(machine - 1.0) >= MIN_MOVE / 2
        why = (f"the machine's own speed samples: {speed_words(machine)} at this run"
               + ("; the machine's, not the path's" if mine else "; not the machine's speed: " + why))
    steal = factor.get("steal_pct")
    if steal and max(steal) >= STEAL_NOTE_PCT:    # the hypervisor's share moved with it: say so first
        why = f"the hypervisor's steal {steal[0]:.1f} % → {steal[1]:.1f} % of the CPUs; {why}"
    return (f"every stage's own CPU work {speed_words(factor['ratio'])} (× {factor['ratio']:.2f}, "
            f"interquartile {factor['low']:.2f}–{factor['high']:.2f} over {factor['stages_n']} stages; {why})")


# The machine's own speed, sampled through each run (run.json host.cpu_speed: agent.host.cpu_speed): `during`
# (every CPU through the load) explained most of the same run's TPS drift on this VM (bench/speed_drift, 8 runs of
# each case: the correlation of log TPS with log speed -0.82 and -0.76, the TPS's spread 6.4 -> 3.9 % and 9.8 ->
# 6.6 % once scaled by it), where one sample before and one after the load did not (scaled by them the spread
# grew): each vCPU flips between two speeds ~1.7x apart every few seconds, and a 40-ms sample catches one CPU in
# one of them.


def sampled_speed(host: dict | None) -> float | None:
    """A run's speed through its load (its host document's cpu_speed.during): blake2b ns per KiB over every CPU;
    None for a run recorded without it."""
    during = ((host or {}).get("cpu_speed") or {}).get("during")
    if isinstance(during, dict) and isinstance(during.get("hash"), (int, float)) and during["hash"] > 0:
        return float(during["hash"])
    return None


def sampled_ratio(a: dict | None, b: dict | None) -> float | None:
    """How much slower the machine ran at run b than at run a, by their samples (b / a: 1.2 = the same work took
    20 % longer); None when either has no sample, or the runs were made on two machines (another CPU: its speed is
    not the drift of one). a, b: the runs' host documents."""
    names = [(h or {}).get("hostname") for h in (a, b)]
    if None not in names and names[0] != names[1]:
        return None
    x, y = sampled_speed(a), sampled_speed(b)
    return y / x if x and y else None
