"""Costs of this machine that one run may not show itself, measured by the runs that do and kept in
/var/lib/pathprof/machine-costs.json (PATHPROF_STATE): every run records the file's content at its start
(run.json `machine_costs`), so `pathprof predict` on that run uses what the machine was known to cost then.

  idle_wakeup_us            the delay of one wakeup onto an idle CPU (idle_exit.*: the CPU leaving idle until
                            the woken process runs), learned from a run whose wakeups often found an idle CPU
                            (analysis.predict_inputs.learned_costs)
  lowload_runqueue_us       the rest of a woken process's wait on a mostly idle machine (its run queue, behind
                            its waker where it was put on the waker's CPU, and the wakeup's latency), per process
                            a transaction wakes, learned from a run with no more clients than CPUs that idled often
  delayline_cpu_us_per_packet, delayline_packets_per_round_trip_each
                            pathprof's own link delay line (agent.host.delayline): its CPU per packet and the
                            packets each delay line (one per delayed direction) handles per round trip, learned
                            from a run that had one
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

PATH = Path(os.environ.get("PATHPROF_STATE", "/var/lib/pathprof")) / "machine-costs.json"


def current(path: Path = PATH) -> dict:
    """The machine's known costs ({} when none was learned yet or the file is unreadable)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def remember(learned: dict, run_dir: str, path: Path = PATH) -> None:
    """Merge what a run measured into the file (each key with the run that measured it and when); atomic."""
    if not learned:
        return
    doc = current(path)
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    doc.update({k: {"value": v, "run": str(run_dir), "at": at} for k, v in learned.items()})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(path)


def learn_from_run(rd, summary: dict) -> dict:
    """After a run: what it measured of the machine, remembered; never fails the run."""
    from pathprof.analysis.predict_inputs import learned_costs
    try:
        learned = learned_costs(rd, summary)
        remember(learned, rd.path)
    except Exception:  # noqa: BLE001 - a cost file that cannot be written costs the next prediction, not this run
        return {}
    return learned
