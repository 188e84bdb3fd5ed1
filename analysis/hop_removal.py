"""What a hop's removal does to the rest of the path (#36.1), learned on this machine from pairs of real runs.

Taking a hop out removes its own CPU and its second connection's kernel work (analysis.scenarios.apply). What is
left of the path then also runs its own work cheaper per transaction: on this 2-CPU VM, 16 clients (2026-11-28,
four pairs, bench/predict_lib/parts.py): without docker-proxy the backend's CPU per transaction fell 25.2 -> 12.9
µs and pgbench's 13.1 -> 7.3 with the same queries; without pgbouncer 20.9 -> 16.1 and 11.0 -> 7.6. Against the
structural removal alone, the measured rest was 0.72, 0.77 (docker-proxy) and 0.71, 0.70 (pgbouncer) of it: fewer
processes interleaved on two CPUs (caches and TLBs refilled after the hop's work, its wakeups' interrupts landing
in whatever ran), the same for a C pooler and a Go proxy. That ratio is not assumed: a `compare` of a path with
and without one of its hops, both runs saturating the CPUs, measures it (not `diff`: its runs may come from another
machine), the machine keeps the last few of each hop (agent.host.machine_costs, `hop_removal_rest_factor`: their
median, their spread widens the band), and `predict
--without` applies it to the rest. Until a pair was seen, a removal is priced structurally and says so.

Pure functions over model bases (analysis.predict.Base)."""
from __future__ import annotations

import statistics
from dataclasses import replace
from typing import TYPE_CHECKING

from pathprof.analysis.predict_inputs import beside_another_load

if TYPE_CHECKING:
    from pathprof.analysis.predict import Base

KEY = "hop_removal_rest_factor"
KEEP = 7                      # the machine keeps this many pairs' ratios of each hop; their median is the factor
SANE = (0.3, 1.5)             # a ratio outside it is not a hop's removal (another load, a broken run): not learned


def factor(machine: dict | None, hops: tuple[str, ...] = ()) -> tuple[float | None, float, str]:
    """(the learned ratio, its spread as a % half-width for the band, where it came from) or (None, 0, ""): the
    median of the pairs that removed the same hop, else of every pair (a hop this machine never saw removed)."""
    entry = (machine or {}).get(KEY)
    if not isinstance(entry, dict) or entry.get("value") is None:
        return None, 0.0, ""
    every = [x for x in entry.get("samples") or [] if isinstance(x, dict) and x.get("value") is not None]
    same = [x for x in every if x.get("hop") in hops]
    chosen = same or every
    samples = [float(x["value"]) for x in chosen] or [float(entry["value"])]
    value = statistics.median(samples)
    spread = (max(samples) - min(samples)) / 2 / value * 100.0 if len(samples) > 1 else 0.0
    which = f"{'/'.join(hops)} removed" if same else "any hop removed"
    last = chosen[-1] if chosen else entry
    return value, spread, (f"the median of {len(samples)} pair(s) of runs on this machine with and without a hop "
                           f"({which}), the last {last.get('run', '?')} at {last.get('at', '?')}")


GONE_SHARE = 0.1              # a hop whose CPU per transaction fell below this share of the base's is off the path


def hops_gone(base_cpu: dict[str, float], target_cpu: dict[str, float]) -> tuple[str, ...]:
    """The base's hops (`hop.<name>.*` CPU components) that the target's path no longer takes: absent from its CPU
    view, or nearly idle there (pgbouncer left running beside a `target=direct` run: 0.01 µs a transaction)."""
    def per_hop(cpu):
        out: dict[str, float] = {}
        for k, v in cpu.items():
            if k.startswith("hop."):
                out[k.split(".")[1]] = out.get(k.split(".")[1], 0.0) + float(v)
        return out
    b, t = per_hop(base_cpu), per_hop(target_cpu)
    return tuple(sorted(h for h, us in b.items() if us > 0 and t.get(h, 0.0) < GONE_SHARE * us))


def structural_rest(b: Base, hops: tuple[str, ...]) -> float:
    """CPU per transaction the model leaves when `hops` go, before any learned ratio."""
    from pathprof.analysis.scenarios import Scenario, apply
    bare = replace(b, machine={k: v for k, v in b.machine.items() if k != KEY})
    return sum(apply(bare, Scenario(without=hops)).cpu.values())


HELD_BUSY = 0.75              # a base held back by a removed hop teaches when its own CPU kept this share of the CPUs


def kept_busy(b: Base) -> bool:
    """The run's own processes kept HELD_BUSY of its CPUs busy: a run a hop's thread held back still teaches."""
    return b.own_cpus >= HELD_BUSY * b.ncpu


def measured_ratio(base: Base, target: Base, hops: tuple[str, ...], drift: float | None = None) -> float | None:
    """The target's CPU per transaction (unprobed, anchored) against what the base leaves without `hops`: a pair
    says it only when both runs kept the CPUs busy at the same client count (else their CPU per transaction holds
    idle wakeups and queueing that differ with the load, not with the hop). The target saturated them; the base
    did, or a hop being removed held it back (its one thread busy, Base.hop_us) while its own
    processes still used HELD_BUSY of the CPUs: a pooler under 16 clients on 2 CPUs (2026-11-28: 1.6-2.1 CPUs, the
    pooler's thread waiting for a CPU more than it ran). Such a base's demand is the one `predict --without` scales
    (its CPU view brought to the path's work, then anchored), so its ratio is taken against that same demand.
    `drift`: how much slower the machine itself ran at the target's run than at the base's (their speed samples,
    analysis.speed.sampled_ratio), taken out: a pair made while the machine slowed down would teach the slowdown
    as the hop's. No other load beside either run (predict_inputs.beside_another_load), as for every learned cost."""
    if not hops or set(hops) - set(base.hops) or base.clients != target.clients:
        return None
    held = bool(set(base.hop_us) & set(hops)) and kept_busy(base)
    if target.regime != "cpu-bound" or not (base.regime == "cpu-bound" or held):
        return None
    if beside_another_load(base, target):
        # another load beside either run moves its CPU per transaction by its own amount and, on 2 CPUs, holds a
        # base back below HELD_BUSY (ci on aad2faf: a lane beside the base, 0.33 CPUs): learned on a machine alone
        return None
    rest = structural_rest(base, hops)
    got = sum(v for k, v in target.cpu.items() if not k.startswith(tuple(f"hop.{h}." for h in hops)))
    if rest <= 0 or got <= 0:
        return None
    ratio = got / rest / (drift if drift and drift > 0 else 1.0)
    return ratio if SANE[0] <= ratio <= SANE[1] else None


def remembered(entry: dict | None, ratio: float, pair: str, at: str, hop: str = "", drift: float | None = None) -> dict:
    """The machine's entry with one more pair's ratio (the last KEEP of each hop kept), its value the median of all;
    `drift`, the machine's own slowdown the ratio was cleared of, kept with it. Also keeps analysis.interleave's
    exponents, `hop` then being the path's shape."""
    samples = [x for x in ((entry or {}).get("samples") or []) if isinstance(x, dict) and "value" in x]
    samples.append({"value": round(ratio, 4), "hop": hop, "run": pair, "at": at,
                    **({"machine_drift": round(drift, 4)} if drift else {})})
    kept = []
    for i, x in enumerate(samples):          # the last KEEP of each hop, in the order learned
        if sum(y.get("hop") == x.get("hop") for y in samples[i + 1:]) < KEEP:
            kept.append(x)
    return {"value": round(statistics.median(x["value"] for x in kept), 4), "run": pair, "at": at,
            "samples": kept}
