"""Inputs of analysis.predict that come from the run's records beside its two views: the WAL device's own time
(for `--wal-device-limit none`) and the machine's costs the run recorded (for what the run itself never showed).
Pure functions of run.json and the run document."""
from __future__ import annotations

from pathlib import PurePath

from pathprof.analysis.run_model import DiskRow, RunMeta, Summary


def wal_device(run: dict | RunMeta, summary: dict | Summary) -> dict | None:
    """run.json postgres.wal_device with `device_us`: what the WAL's device itself takes per transaction, from
    the disk view (block request issued to completed; a throttle holds a bio before the request exists, so its
    queue is not in it). A commit's fdatasync issues its writes together and waits for them, then for one cache
    flush: per cache flush, one write's mean time plus one flush's (summing every request would count the
    writes that overlapped once each). Without cache flushes: every request's time. None when the WAL had no
    device of its own."""
    run, summary = RunMeta.of(run), Summary.of(summary)
    dev = run.postgres.wal_device
    if not dev or not dev.get("device"):
        return None
    name = PurePath(str(dev["device"])).name
    rows = {d.op: d for d in summary.disk if d.device == name}
    return {**dev, "device": name, "device_us": _device_us(rows) if rows else None}


def _device_us(rows: dict[str, DiskRow]) -> float:
    flush, write = rows.get("flush"), rows.get("write")
    if flush and flush.requests_per_txn and flush.mean_us is not None:
        return float(flush.requests_per_txn) * (float(flush.mean_us) + float((write.mean_us if write else 0) or 0))
    return sum(float(d.us_per_txn) for d in rows.values())


LEARN_IDLE_EVENTS_PER_TXN = 0.3   # a run that woke a process onto an idle CPU this often prices that wakeup
# ... unless other processes kept the CPUs this busy beside it: its wakeups then waited behind them (a test suite's
# pgbouncer run beside the other lane's 16 clients taught this machine 172.6 µs of run queue per woken process
# where a lone client here waits 1.5-9: every later one-client prediction was short by an order of magnitude)
LEARN_MAX_FOREIGN_CPUS = 0.1


def beside_another_load(*bases) -> bool:
    """Another load used LEARN_MAX_FOREIGN_CPUS or more beside one of these runs (analysis.predict.Base): a machine
    cost is learned from runs with the machine to themselves (every learned cost, every pair)."""
    return max(b.foreign_cpus for b in bases) >= LEARN_MAX_FOREIGN_CPUS
MIN_DELAYLINE_PACKETS = 1000
MAX_SMALL_MESSAGE_PACKETS = 4.0    # a request and its reply, each a packet or two, with their ACKs


def learned_costs(rd, summary: dict | Summary) -> dict:
    """What a finished run measured of the machine (agent.host.machine_costs keeps it): the delay of one wakeup
    onto an idle CPU (idle_exit.*: the CPU leaving idle until the woken process runs), when its wakeups found an
    idle CPU often enough to price one; the delay line's CPU per packet and packets per round trip, when the run
    had one (packets per round trip through each delay line: one line per delayed direction)."""
    from pathprof.analysis.predict import base_from_run, progress_tps
    from pathprof.errors import UserError
    out: dict = {}
    summary, run = Summary.of(summary), rd.run
    try:
        b = base_from_run(summary, progress_tps(rd.path), run.topology.spec or {})
    except UserError:
        return out
    idle = [s for s in summary.stages if s.name.startswith("idle_exit.") and s.parent is None]
    events = sum(float(s.count_per_txn or 0) for s in idle)
    if events >= LEARN_IDLE_EVENTS_PER_TXN and _foreign_cpus(summary) < LEARN_MAX_FOREIGN_CPUS:
        out["idle_wakeup_us"] = round(sum(float(s.us_per_txn) for s in idle) / events, 2)
        # and the rest of a woken process's wait on a mostly idle machine, per process a transaction wakes: the
        # run queue (behind its waker where it was put on the waker's CPU) and the wakeup's own latency
        if b.clients <= (summary.host.cpus or 1):
            waits = sum(float(s.us_per_txn) for s in summary.stages if s.parent is None
                        and s.name.startswith(("runqueue.", "wakeup.")))
            out["lowload_runqueue_us"] = round(waits / max(b.receivers, 1), 2)
    lines = run.delay_lines or []
    packets, cpu = sum(x["packets"] for x in lines), sum(x["cpu_us"] for x in lines)
    txns = float(summary.transactions or 0)
    if packets >= MIN_DELAYLINE_PACKETS and txns:
        out["delayline_cpu_us_per_packet"] = round(cpu / packets, 3)
        # per delay line: a run may delay one direction or both, a scenario either. Only a run of small messages
        # says what a round trip costs the line: large results or retransmissions (81 packets per round trip in
        # a CI run through docker-dnat) describe that run's workload, and every later prediction would take them
        per_rt = packets / (txns * b.round_trips * len(lines))
        if per_rt <= MAX_SMALL_MESSAGE_PACKETS:
            out["delayline_packets_per_round_trip_each"] = round(per_rt, 3)
    return out


def _foreign_cpus(summary: Summary) -> float:
    """CPUs other processes used during the run's windows (the CPU view's `other`)."""
    other = sum(float(c.us_per_txn) for c in summary.cpu if c.component == "other")
    tps = float((summary.windows.tps_in if summary.windows else None) or summary.tps or 0.0)
    return other * tps / 1e6


def machine_value(machine: dict | None, key: str) -> tuple[float | None, str]:
    """A machine cost (agent.host.machine_costs's entries) and where it came from, for the assumptions."""
    entry = (machine or {}).get(key)
    if not isinstance(entry, dict) or entry.get("value") is None:
        return None, ""
    n = len(entry.get("samples") or ())
    if n > 1:
        return float(entry["value"]), (f"the median of the last {n} runs that measured it on this machine, the last "
                                       f"{entry.get('run', '?')} at {entry.get('at', '?')}")
    return float(entry["value"]), f"measured on this machine by {entry.get('run', '?')} at {entry.get('at', '?')}"
