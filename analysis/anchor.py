"""Anchoring the model on its run (analysis.predict): the queueing centres of a base, their solution, and the
demands set so that the model reproduces the TPS the run measured without probes at its own client count: on a
CPU-bound run (or one a hop's busy thread held back) by scaling the CPU demand, on a latency-bound one by the delay
of waking onto idle CPUs that the cycle leaves. Split from analysis.predict, which builds the base and predicts."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from pathprof.analysis.mva import Centre, solve
from pathprof.analysis.predict_inputs import LEARN_IDLE_EVENTS_PER_TXN, machine_value
from pathprof.analysis.run_model import Summary

if TYPE_CHECKING:
    from pathprof.analysis.predict import Base

IDLE = ("idle_exit.",)
SATURATED = 0.9       # a centre this busy per server limits throughput
MIN_IDLE_EVENTS_PER_TXN = 0.05   # wakeups onto idle CPUs per transaction needed to price one
ANCHOR_RANGE = (0.25, 4.0)       # how far anchoring may scale a demand; beyond it the model and run disagree


def stage_sum(summary: Summary, prefixes: tuple) -> float:
    return sum(float(s.us_per_txn) for s in summary.stages if s.parent is None and s.name.startswith(prefixes))


def anchor(b: Base, summary: Summary) -> bool:
    """Make the model reproduce the measured (unprobed) TPS at the run's own client count; False when a
    latency-bound run's cannot be (_anchor_latency)."""
    idle_stages = stage_sum(summary, IDLE)
    events = sum(float(s.count_per_txn or 0) for s in summary.stages if s.name.startswith(IDLE))
    b.receivers = len({(s.name.split(".", 1)[1], s.leg) for s in summary.stages
                       if s.name.startswith(("wakeup.", "idle_exit.", "queued.", "runqueue."))}) or 2
    b.think_us = sum(b.delays.values())
    if not b.measured_tps:
        return True
    b.hop_awake = _awake_shares(b, summary)
    hop = max((h for h, a in b.hop_awake.items() if a >= SATURATED), key=b.hop_awake.get, default=None)
    if hop:
        awake = b.hop_awake[hop]
        # a hop's one thread was busy nearly all the time: its demand under load is the time it holds its
        # thread per transaction (busy share / TPS): its CPU, plus waiting for a CPU shared with the others
        cpu_us = b.cpu.get(f"hop.{hop}.user", 0.0) + b.cpu.get(f"hop.{hop}.sys", 0.0)
        b.hop_us[hop] = max(cpu_us, awake * 1e6 / b.measured_tps)
        b.notes.append(f"hop {hop}'s thread found its next message waiting {awake * 100:.0f} % of the time: "
                       f"busy, it limited the run and holds its thread {b.hop_us[hop]:.1f} µs per transaction "
                       f"({cpu_us:.1f} µs of it on a CPU, the rest waiting for a CPU shared with the others)")
    if b.regime != "cpu-bound" and not hop:
        return _anchor_latency(b, summary, idle_stages)
    # (a hop's saturated thread limited the run as the CPUs would: its queue, not idle wakeups, fills the
    # cycle; fitting the cycle's rest to idle wakeups would price them at hundreds of µs)
    # priced only when enough transactions saw one (counts per transaction are rounded to 0.001)
    per_event = idle_stages / events if events >= MIN_IDLE_EVENTS_PER_TXN else 0.0
    b.idle_us = per_event * b.receivers
    machine_idle, source = machine_value(b.machine, "idle_wakeup_us")
    rq, rq_source = machine_value(b.machine, "lowload_runqueue_us")
    if events < LEARN_IDLE_EVENTS_PER_TXN and machine_idle and rq is not None:
        # a transaction on an idle machine: the processes it wakes find an idle CPU as long as there is one
        # (a 1-client loopback run: 1.92 idle exits for its 2 processes; docker-dnat's 4 and pgbouncer's 4:
        # 2.6 and 1.9, the others woken onto their waker's CPU), and every one waits on a run queue
        exits = min(b.receivers, max(int(b.ncpu + 0.5), 1))
        b.idle_us = exits * machine_idle + b.receivers * rq
        per_event = b.idle_us / b.receivers
        b.notes.append(f"the run woke a process onto an idle CPU {events:.2f} times per transaction: on an idle "
                       f"machine its {b.receivers} processes woken per transaction would leave idle {exits} "
                       f"CPUs ({machine_idle:.1f} µs each, {source}) and wait {rq:.1f} µs each on a run queue "
                       f"({rq_source})")
    elif events < LEARN_IDLE_EVENTS_PER_TXN and machine_idle:
        # the run (nearly) never idled: the few idle exits a saturated run has are outliers (a process woken
        # after a stall), so the machine's delay of one wakeup onto an idle CPU, learned by a run that idled
        # often (agent.host.machine_costs), prices each process a transaction wakes
        per_event, b.idle_us = machine_idle, machine_idle * b.receivers
        b.notes.append(f"the run woke a process onto an idle CPU {events:.2f} times per transaction: that delay "
                       f"is the machine's, {machine_idle:.1f} µs per wakeup onto an idle CPU, {b.receivers} "
                       f"wakeups per transaction, {source}")
    if not (hop or b.lock_us) or solve_base(b, b.clients).tps > b.measured_tps:
        # the CPUs limit: scale their demand until the model gives the measured rate
        orig = dict(b.cpu)
        f = _bisect(b, lambda f: b.cpu.update({k: v * f for k, v in orig.items()}))
        b.cpu_scale *= f
        if not ANCHOR_RANGE[0] * 1.01 < f < ANCHOR_RANGE[1] * 0.99:
            b.notes.append(f"the model cannot reproduce this run's TPS by scaling its CPU demand within "
                           f"{ANCHOR_RANGE[0]:g}..{ANCHOR_RANGE[1]:g}x: its predictions are not anchored")
    if not per_event:
        b.idle_priced = False
        b.notes.append("the run saw too few wakeups onto idle CPUs to price one: predictions at fewer clients "
                       "than saturate the CPUs leave that delay out and come out too high")
    return True


def _anchor_latency(b: Base, summary: dict, idle_stages: float) -> bool:
    """A latency-bound run: what the queues and named delays leave of the measured cycle is the time spent
    waking onto idle CPUs (idle_exit.*, and the run-queue waits while a CPU leaves idle), a delay that fades as
    the CPUs fill, up to what those stages measured; anything beyond is held as a fixed delay. False (nothing
    changed) when no idle wakeup can fill it: the model's CPUs are saturated at the run's clients."""
    cycle = b.clients * 1e6 / b.measured_tps
    rest = cycle - solve_base(b, b.clients).cycle_us
    if rest <= 0.005 * cycle:      # the queues already account for the cycle (a saturated one pins it)
        return True
    idle_seen = idle_stages + stage_sum(summary, ("runqueue.",))
    target = cycle - max(rest - idle_seen, 0.0)
    lo, hi = 0.0, max(cycle, 1.0) * 20
    for _ in range(60):
        b.idle_us = (lo + hi) / 2
        if solve_base(b, b.clients).cycle_us < target:
            lo = b.idle_us
        else:
            hi = b.idle_us
    if solve_base(b, b.clients).cycle_us < 0.99 * target:
        b.idle_us = 0.0
        return False
    if rest > idle_seen:
        b.think_us += rest - idle_seen
        b.delays["what the queues leave of the measured cycle (held fixed)"] = rest - idle_seen
    b.delays[f"idle wakeups at full idle (the run's idle_exit.* were {idle_stages:.1f} µs)"] = b.idle_us
    return True


def solve_base(b: Base, clients: int):
    return solve(centres(b, clients), clients, b.think_us, cpu_centre="cpu", background_util=b.background_util)


def _bisect(b: Base, set_factor) -> float:
    """Find the factor (applied by set_factor) at which the model gives the measured TPS at the run's clients."""
    lo, hi = ANCHOR_RANGE
    f = 1.0
    for _ in range(60):
        f = math.sqrt(lo * hi)
        set_factor(f)
        if solve_base(b, b.clients).tps > b.measured_tps:
            lo = f
        else:
            hi = f
    return f


def _awake_shares(b: Base, summary: Summary) -> dict[str, float]:
    """Per hop, the share of its messages that found its thread already awake (queued.<hop> against wakeup.<hop>
    and idle_exit.<hop>): at SATURATED and above, the thread was busy nearly all the time and limits the run."""
    out = {}
    for h in b.hops:
        counts = {k: 0.0 for k in ("queued", "other")}
        for s in summary.stages:
            if s.name in (f"queued.{h}", f"wakeup.{h}", f"idle_exit.{h}"):
                counts["queued" if s.name.startswith("queued.") else "other"] += float(s.count_per_txn or 0)
        total = counts["queued"] + counts["other"]
        if total:
            out[h] = counts["queued"] / total
    return out


def centres(b: Base, clients: int) -> list[Centre]:
    cpu = sum(b.cpu.values())
    cs = [Centre("cpu", cpu, servers=b.ncpu, serial_us=cpu * b.path_share if b.path_share < 1.0 else None)]
    for h in b.hops:
        d = b.hop_us.get(h, b.cpu.get(f"hop.{h}.user", 0.0) + b.cpu.get(f"hop.{h}.sys", 0.0))
        if d > 0:
            cs.append(Centre(f"hop.{h}", d, overlaps=True))
    client = b.cpu.get(f"{b.client}.user", 0.0) + b.cpu.get(f"{b.client}.sys", 0.0)
    if client > 0:
        cs.append(Centre("client", client, servers=min(clients, max(int(b.ncpu + 0.5), 1)), overlaps=True))
    if b.lock_us > 0:   # its service (execution, WAL flush) is counted elsewhere; the waiting for it is added
        cs.append(Centre("backend.lock", b.lock_us, overlaps=True))
    if b.wal_us > 0 and not b.lock_us:     # under a row lock the flush is part of its hold time
        cs.append(Centre("backend.wal_flush", b.wal_us))
    for link, (lines, us) in b.delaylines.items():   # each delay line is one thread; its CPU is counted at the CPUs
        cs.append(Centre(f"delayline.{link}", us, servers=lines, overlaps=True))
    cs.append(Centre("idle", b.idle_us, servers=0, idle_scaled=True))
    return cs
