"""The words of analysis.predict: what limits a prediction, and the assumptions printed with it."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathprof.analysis.predict import Base

LIMIT_TEXT = {"cpu": "the CPUs", "client": "the client (pgbench's threads)", "backend.lock": "a row lock",
              "backend.wal_flush": "the backend's WAL flush"}


def limited_by(b: Base, sol, saturated: float) -> tuple[str, str]:
    """What limits a solution: the busiest queue when it is at least `saturated` busy, else latency."""
    util = sol.utilisation
    busiest = max((k for k in util if k != "idle"), key=lambda k: util[k], default=None)
    if busiest and util[busiest] >= saturated:
        if busiest.startswith("hop."):
            return busiest, f"hop {busiest[4:]}'s process (one thread, {util[busiest] * 100:.0f} % busy)"
        if busiest.startswith("delayline."):
            return busiest, (f"pathprof's delay line on {busiest[10:]} (its daemons' threads, "
                             f"{util[busiest] * 100:.0f} % busy)")
        what = LIMIT_TEXT.get(busiest, busiest)
        if busiest == "cpu":
            what = f"the CPUs ({b.ncpu:.2f}, {util[busiest] * 100:.0f} % busy)"
        return busiest, what
    parts = {**{k: v for k, v in sol.residence_us.items()}, "delays": b.think_us}
    top = max(parts, key=parts.get)
    return "latency", f"latency: no resource saturated (largest part of the cycle: {top}, {parts[top]:.1f} µs)"


def assumptions_of(b: Base, centres: list) -> list[str]:
    """The model's assumptions for a base, printed with every prediction: each queue and delay with its figure,
    the anchor, and the notes the base collected (what was scaled, what came from the machine, what is unpriced)."""
    out = []
    for c in centres:
        if c.name == "cpu":
            out.append(f"queue: the CPUs, {b.ncpu:.2f} servers (Seidmann's multi-server MVA), {c.demand_us:.1f} µs "
                       "CPU per transaction without the probes")
        elif c.name.startswith("hop."):
            out.append(f"queue: {c.name} (one thread), {c.demand_us:.1f} µs CPU per transaction; its service is "
                       "counted at the CPUs, its waiting for the thread added")
        elif c.name == "client":
            out.append(f"queue: the client, pgbench's threads (min(clients, CPUs)), {c.demand_us:.1f} µs CPU per "
                       "transaction")
        elif c.name == "backend.lock":
            out.append(f"queue: a row lock every transaction takes, held {c.demand_us:.0f} µs per transaction")
        elif c.name == "backend.wal_flush":
            out.append(f"queue: the backend's WAL flush (one at a time), {c.demand_us:.1f} µs per transaction")
        elif c.name.startswith("delayline."):
            out.append(f"queue: pathprof's delay line on {c.name[10:]} ({c.servers} daemon(s), one thread each), "
                       f"{c.demand_us:.1f} µs CPU per transaction; its service is counted at the CPUs")
        elif c.name == "idle" and c.demand_us:
            out.append(f"delay, fading as the CPUs fill: wakeups onto idle CPUs, {c.demand_us:.1f} µs per "
                       "transaction when the CPUs are idle")
    for n, us in b.delays.items():
        if us and not n.startswith("idle"):
            out.append(f"delay: {n}, {us:.1f} µs per transaction")
    out.append(f"anchored on the run: {b.measured_tps:,.0f} TPS measured without probes at {b.clients} clients "
               "is reproduced (with the foreign load it had, when it had any)")
    return out + b.notes
