"""A lone client's path work against a loaded run's (#36: one client from a saturated run). Under load the kernel
and the processes batch: a softirq serves several packets, a woken process finds more than one message, caches stay
warm. A client alone on the machine pays the whole path for each transaction: on this VM a 1-client nic run's work on
the path was 1.24-1.55x what its 16-client run's CPU view put on the path, loopback's and unix's 0.9-1.2x, behind
docker-proxy or pgbouncer 0.74-0.98x (bench/predict, four rounds of 2026-11-29). Which way, and how much, is the
path's own: it is learned from a pair of runs of one path, one loading the CPUs and one with fewer clients than
CPUs (a `pathprof sweep --clients 1,16`, or a `compare` of the two), kept per shape of path as
analysis.interleave keeps its exponents, and applied to predictions below the CPUs' count from a loaded run.

The factor of a pair: the lone run's CPU demand (predict.base_from_run: a latency-bound run's demand is the work
on its path) over the loaded run's demand on the path (its anchored CPU per transaction times its path share)."""
from __future__ import annotations

import statistics
from dataclasses import replace

from pathprof.analysis.interleave import shape
from pathprof.analysis.predict_inputs import beside_another_load

KEY = "lone_client_path_factor"
SANE = (0.5, 2.0)       # a factor outside it is not the path's batching (another load, a broken run): not learned
MIN_PAIRS = 2           # one pair is one minute of a machine whose speed drifts 15-30 %


def measured_factor(base, target, drift: float | None = None) -> float | None:
    """The factor a pair of Bases of one path shows (`base` loading the CPUs, `target` with fewer clients than
    CPUs), or None when the pair cannot tell it. `drift`: how much slower the machine ran at the target's run."""
    if sorted(base.hops) != sorted(target.hops):
        return None
    if base.regime != "cpu-bound" or base.clients < base.ncpu or target.clients >= target.ncpu:
        return None
    if target.regime == "cpu-bound" or beside_another_load(base, target):
        return None
    on_path = sum(base.cpu.values()) * base.path_share
    lone = sum(target.cpu.values()) / (drift if drift and drift > 0 else 1.0)
    if on_path <= 0 or lone <= 0:
        return None
    f = lone / on_path
    return f if SANE[0] <= f <= SANE[1] else None


def factor(machine: dict | None, hops=()) -> tuple[float | None, int, str]:
    """(the median factor of the machine's pairs of this shape of path, how many, where from) or (None, n, "")."""
    entry = (machine or {}).get(KEY)
    chosen = [x for x in ((entry or {}).get("samples") or []) if isinstance(x, dict) and "value" in x
              and x.get("hop", "direct") == shape(hops)]
    if len(chosen) < MIN_PAIRS:
        return None, len(chosen), ""
    return (statistics.median(float(x["value"]) for x in chosen), len(chosen),
            f"the median of {len(chosen)} pair(s) of {shape(hops)} runs on this machine, loaded and with a lone "
            f"client, the last {chosen[-1].get('run', '?')}")


def at_clients(b, clients: int):
    """The base with its work on the path at `clients` (and the note saying so): scaled by the learned factor
    when a loaded run predicts fewer clients than CPUs, else the base itself."""
    if clients >= b.ncpu or b.clients < b.ncpu or b.regime != "cpu-bound":
        return b, None
    f, n, src = factor(b.machine, b.hops)
    if f is None or abs(f - 1.0) < 0.005:
        return b, None
    cpu = sum(b.cpu.values())
    path = cpu * b.path_share
    new = cpu - path + path * f
    if cpu <= 0 or new <= 0:
        return b, None
    note = (f"at {clients} client(s), fewer than the CPUs, the work on the transaction's path is x{f:.2f} what it was "
            f"under the run's load ({src})")
    return replace(b, cpu={k: v * new / cpu for k, v in b.cpu.items()}, path_share=min(path * f / new, 1.0),
                   notes=b.notes + [note]), note
