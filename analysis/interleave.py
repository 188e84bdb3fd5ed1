"""What a transaction's CPU costs at another client count (#36), learned on this machine from pairs of real runs.

The model's CPU demand per transaction is measured at the run's own client count. On a saturated machine it is
not the same at another: every client adds a backend the CPUs take turns with, and each process finds less of its
working set in the caches and TLBs it shares with the others. On this 2-CPU VM (2026-11-28, bench/predict, three
rounds, the machine's drift taken out by its speed samples): the same path at 4 clients ran 0.89-1.50x the TPS of
16 on loopback, unix and nic, median ~1.13, with both runs saturating the CPUs; a constant demand predicted every
4-client run short. How much the cost grows is the machine's (its caches, its hypervisor), so it is not assumed:
a `compare` or `sweep` of one path at two client counts, both runs saturating the CPUs, measures it as an exponent
of the processes each CPU interleaves (`interleave_cpu_exponent`: CPU per transaction ~ (processes per CPU) ** e),
the machine keeps the last few of each shape of path (agent.host.machine_costs; their median, its uncertainty
widens the band), and `predict` at another client count scales the demand by it. Until MIN_PAIRS pairs of the
path's shape were measured, the demand is the run's, and the prediction says how to teach it.

A pooled path whose pooler's one thread held it back (pgbouncer at 4 and 16 clients on 2 CPUs, 2026-11-28: 1.6-1.8
CPUs used, the thread awake for 83-98 % of its messages) saturates no CPU, and what limits it is the time the thread
holds per transaction, its CPU and its wait for a CPU shared with the others: 17-21 µs at 4 clients against 22-24 at
16. Such pairs teach the hold's exponent (0.12-0.32), kept under a shape of their own ("pgbouncer held:pgbouncer"),
and price a base its thread held; without them such a base predicted 4 clients 17.6 % short (the median of three).

Pure functions over model bases (analysis.predict.Base)."""
from __future__ import annotations

import functools
import math
import statistics
from dataclasses import replace
from typing import TYPE_CHECKING

from pathprof.analysis.predict_inputs import beside_another_load

if TYPE_CHECKING:
    from pathprof.analysis.predict import Base

KEY = "interleave_cpu_exponent"
SANE = (-0.3, 0.6)           # an exponent outside it is not interleaving (another load, a broken run): not learned
MIN_SPREAD = math.log(1.5)   # two runs this close in processes per CPU cannot tell an exponent from noise
PAIR_SD = 0.12               # one pair's exponent on this VM: -0.10 ... 0.36 over 12 pairs of direct paths
MIN_PAIRS = 3                # as noisy as one pair is, fewer would move a prediction by the weather: a single
                             # pgbouncer pair's -0.20 put two of three later 4-client predictions 24-31 % short


def processes_per_cpu(clients: int, ncpu: float, hops: int = 0) -> float:
    """The processes each CPU takes turns with at `clients` connections: a backend each, the client's threads
    (pgbench: one per CPU at most), one per hop."""
    ncpu = max(ncpu, 1.0)
    return (clients + min(clients, int(ncpu + 0.5)) + hops) / ncpu


def shape(hops, held_by: str | None = None) -> str:
    """What a pair is kept under: the path's hops (a hop's one thread batches messages under load, so a pooled
    path's cost moves with the clients unlike a direct one's), and the hop whose thread held the runs back when one
    did (then its hold time was measured, not the CPUs': "pgbouncer held:pgbouncer")."""
    return ("+".join(sorted(hops)) or "direct") + (f" held:{held_by}" if held_by else "")


def held_by(b: Base) -> str | None:
    """The hop whose one thread limited a run that did not saturate the CPUs (Base.hop_us), or None: as
    pair_shape keeps pairs (a CPU-bound run's demand is the CPUs' whatever its hops did)."""
    return None if b.regime == "cpu-bound" else max(b.hop_us, key=b.hop_us.get, default=None)


def pair_shape(base: Base, target: Base) -> str:
    """The shape a pair's exponent is kept under (measured_exponent's choice of demand)."""
    both_cpu = base.regime == target.regime == "cpu-bound"
    return shape(base.hops, None if both_cpu else _holding_hop(base, target))


def exponent(machine: dict | None, hops=(), held: str | None = None) -> tuple[float | None, float, str]:
    """(the learned exponent, the uncertainty of that median as a % of the factor per doubling of the processes,
    where it came from) or (None, 0, ""): the median of the pairs of paths with the same hops. Another shape's
    pairs are not used: a pooler's one thread batches more messages per wakeup as clients grow, so a pooled path
    got cheaper where a direct one got dearer (bench/predict 2026-11-28: -0.20 against -0.10 ... 0.36)."""
    chosen = _samples(machine, hops, held)
    if not chosen:
        return None, 0.0, ""
    samples = [float(x["value"]) for x in chosen]
    value = statistics.median(samples)
    # the median's own uncertainty: 1.4826 MAD / sqrt(n) from three pairs on, a single pair's spread before
    sd = 1.4826 * statistics.median(abs(x - value) for x in samples) if len(samples) > 2 else PAIR_SD
    spread = (2 ** (sd / math.sqrt(len(samples))) - 1) * 100.0
    last = chosen[-1]
    return value, spread, (f"the median of {len(samples)} pair(s) of runs of {shape(hops)} paths{_held(held)} on "
                           f"this machine at two client counts, the last {last.get('run', '?')} at "
                           f"{last.get('at', '?')}")


def _held(held: str | None) -> str:
    return f" held back by {held}'s thread (its hold time measured)" if held else ""


def at_clients(b: Base, clients: int) -> tuple[Base, str | None]:
    """The base with its CPU demand at `clients` (and the note saying so), by the machine's learned exponent;
    the base itself at its own client count, below the CPUs' count, or before the machine measured MIN_PAIRS."""
    if clients == b.clients or min(clients, b.clients) < b.ncpu:
        # fewer clients than CPUs leave CPUs idle rather than interleaved: a lone client's cost is its path's work
        # and its wakeups onto idle CPUs, which the model prices apart (on this VM a 1-client loopback run's path
        # work was the 16-client run's CPU per transaction within 7 %, where 4 clients cost 0.8 of it)
        return b, None
    held = held_by(b)
    e, spread, src = exponent(b.machine, b.hops, held)
    pairs = len(_samples(b.machine, b.hops, held))
    if e is None or pairs < MIN_PAIRS:
        note = (f"at {clients} clients the CPU per transaction is the run's at {b.clients}: the machine has measured "
                f"{pairs} pair(s) of {shape(b.hops)} runs{_held(held)} at two client counts, {MIN_PAIRS} are needed "
                f"(`pathprof sweep --clients {min(clients, b.clients)},{max(clients, b.clients)} --repeat "
                f"{MIN_PAIRS}` on this path teaches it; on pathprof's 2-core test VM a direct path cost ~0.85x at 4 "
                "clients what it did at 16)")
        return replace(b, notes=b.notes + [note]), note
    p0 = processes_per_cpu(b.clients, b.ncpu, len(b.hops))
    p1 = processes_per_cpu(clients, b.ncpu, len(b.hops))
    f = (p1 / p0) ** e
    if abs(f - 1.0) < 0.005:
        return b, None
    extra = spread * abs(math.log2(p1 / p0))        # the learned median's uncertainty, over the doublings made
    band = math.sqrt(b.band_pct ** 2 + extra ** 2)
    note = (f"at {clients} clients each CPU interleaves {p1:.1f} processes against {p0:.1f} in the run: its CPU per "
            f"transaction x{f:.2f} (exponent {e:.2f}, {src})")
    return replace(b, cpu={k: v * f for k, v in b.cpu.items()}, hop_us={k: v * f for k, v in b.hop_us.items()},
                   band_pct=round(band, 1), band_parts={**b.band_parts, "interleave_pct": round(extra, 1)},
                   notes=b.notes + [note]), note


def _samples(machine: dict | None, hops, held: str | None = None) -> list[dict]:
    """The machine's pairs of paths shaped like `hops` (held back by `held`'s thread, when given), oldest first."""
    entry = (machine or {}).get(KEY)
    if not isinstance(entry, dict):
        return []
    return [x for x in entry.get("samples") or [] if isinstance(x, dict) and isinstance(x.get("value"), (int, float))
            and x.get("hop", "direct") == shape(hops, held)]


HELD_AWAKE = 0.8              # a hop's thread found this share of its messages waiting in both runs: it held them


def measured_exponent(base: Base, target: Base, drift: float | None = None) -> float | None:
    """The exponent a pair of runs of one path shows: both saturating the CPUs (else their CPU per transaction
    holds idle wakeups and queueing that differ with the load), the same hops, client counts far enough apart, no
    other load beside either. Or both held back by one hop's thread with the CPUs still busy (a pooler: 4 and 16
    clients on 2 CPUs, 2026-11-28): the demand that limits is then the time the thread holds per transaction (its
    CPU and its wait for one), and it is that time's growth with the processes interleaved that is measured.
    `drift`: how much slower the machine itself ran at the target's run (analysis.speed.sampled_ratio), taken out."""
    if sorted(base.hops) != sorted(target.hops):
        return None
    demand = _demand
    if base.regime != "cpu-bound" or target.regime != "cpu-bound":
        hop = _holding_hop(base, target)
        if hop is None:
            return None
        demand = functools.partial(_hold_us, hop=hop)
    if beside_another_load(base, target):
        # another load beside either run moved its CPU per transaction by its own amount (beside a 16-client run,
        # ten pairs on this VM ranged -0.30 ... 0.38): a machine cost is learned on a machine to itself
        return None
    p0 = processes_per_cpu(base.clients, base.ncpu, len(base.hops))
    p1 = processes_per_cpu(target.clients, target.ncpu, len(target.hops))
    if abs(math.log(p1 / p0)) < MIN_SPREAD:
        return None
    a, b = demand(base), demand(target) / (drift if drift and drift > 0 else 1.0)
    if a <= 0 or b <= 0:
        return None
    e = math.log(b / a) / math.log(p1 / p0)
    return e if SANE[0] <= e <= SANE[1] else None


def _demand(b: Base) -> float:
    """The anchored CPU per transaction (unprobed: the anchor reproduced the TPS measured without probes)."""
    return sum(b.cpu.values())


def _hold_us(b: Base, hop: str) -> float:
    """The time a hop's thread holds per transaction: its awake share over the unprobed TPS."""
    return b.hop_awake[hop] * 1e6 / b.measured_tps if b.measured_tps else 0.0


def _holding_hop(base: Base, target: Base) -> str | None:
    """The hop whose one thread held both runs back (awake for HELD_AWAKE of its messages) while their own
    processes kept the CPUs busy (analysis.hop_removal.kept_busy), or None."""
    from pathprof.analysis.hop_removal import kept_busy
    if not (kept_busy(base) and kept_busy(target)):
        return None
    held = [h for h in base.hops if min(base.hop_awake.get(h, 0.0), target.hop_awake.get(h, 0.0)) >= HELD_AWAKE]
    return max(held, key=lambda h: base.hop_awake[h] + target.hop_awake[h], default=None)
