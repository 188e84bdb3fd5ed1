"""Costs of this machine that one run may not show itself, measured by the runs that do and kept in
/var/lib/pathprof/machine-costs.json (PATHPROF_STATE, or the file PATHPROF_MACHINE_COSTS names): every run records
the file's content at its start (run.json `machine_costs`), so `pathprof predict` on that run uses what the machine
was known to cost then.

  idle_wakeup_us            the delay of one wakeup onto an idle CPU (idle_exit.*: the CPU leaving idle until
                            the woken process runs), learned from a run whose wakeups often found an idle CPU
                            (analysis.predict_inputs.learned_costs)
  lowload_runqueue_us       the rest of a woken process's wait on a mostly idle machine (its run queue, behind
                            its waker where it was put on the waker's CPU, and the wakeup's latency), per process
                            a transaction wakes, learned from a run with no more clients than CPUs that idled often
  hop_removal_rest_factor   what the rest of a path costs per transaction without one of its hops against what
                            it cost beside it (analysis.hop_removal), learned from a `compare` of a path with and
                            without a hop, both saturating the CPUs: the last pairs of each hop
  lone_client_path_factor   a lone client's work on the path against a loaded run's (analysis.lone_client),
                            learned from a `compare` or `sweep` of one path with fewer clients than CPUs and with
                            the CPUs loaded: the last pairs of each shape of path
  interleave_cpu_exponent   how a transaction's CPU grows with the processes each CPU interleaves
                            (analysis.interleave), learned from a `compare` or `sweep` of one path at two client
                            counts, both saturating the CPUs: the last pairs of each shape of path (direct, or its
                            hops)
  prediction_miss_pct       how far a prediction from one run missed another run of the same path and workload
                            (the question: fewer clients, more clients, without a hop), learned from every
                            `compare` and `sweep` (analysis.prediction_misses): the bands of the next predictions
  delayline_cpu_us_per_packet, delayline_packets_per_round_trip_each
                            pathprof's own link delay line (agent.host.delayline): its CPU per packet and the
                            packets each delay line (one per delayed direction) handles per round trip, learned
                            from a run that had one
"""
from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

# PATHPROF_MACHINE_COSTS: another file (a test that teaches the machine without touching what it knows)
PATH = Path(os.environ.get("PATHPROF_MACHINE_COSTS") or
            Path(os.environ.get("PATHPROF_STATE", "/var/lib/pathprof")) / "machine-costs.json")


def current(path: Path = PATH) -> dict:
    """The machine's known costs ({} when none was learned yet or the file is unreadable)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


# A run's figure is kept with the last few others': one run is one path's view of a machine cost (a wakeup onto an
# idle CPU came out 3.3 µs in 1-client loopback, nic and pgbouncer runs and 5.9 µs in a docker-dnat one, stop 51),
# and whichever path ran last priced every other's; their median does not depend on the order they ran in
RECENT_RUNS = 5


def remember(learned: dict, run_dir: str, path: Path = PATH) -> None:
    """Merge what a run measured into the file: each key's value is the median of the last RECENT_RUNS runs that
    measured it (kept as its samples), with the last run and when; atomic."""
    if not learned:
        return
    doc = current(path)
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for k, v in learned.items():
        old = doc.get(k) if isinstance(doc.get(k), dict) else {}
        samples = [x for x in old.get("samples") or ([old] if "value" in old else [])
                   if isinstance(x, dict) and isinstance(x.get("value"), (int, float))]
        samples = (samples + [{"value": v, "run": str(run_dir), "at": at}])[-RECENT_RUNS:]
        doc[k] = {"value": statistics.median(x["value"] for x in samples), "run": str(run_dir), "at": at,
                  "samples": samples}
    _write(doc, path)


def _write(doc: dict, path: Path) -> None:
    """The file's new content, atomically (a reader never sees half of it)."""
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


def _same_workload(a, b) -> bool:
    """Two runs of one workload (another one moves the path's costs, and the model's misses, too)."""
    from pathprof.analysis.run_model import Summary
    wa, wb = (Summary.of(x).workload for x in (a, b))
    return (wa.mode, wa.script, wa.scale, wa.rate, wa.threads) == (wb.mode, wb.script, wb.scale, wb.rate, wb.threads)


@dataclass
class PairLesson:
    """What one pair of runs (a `compare` or `sweep`: base, other) measured of the machine, or why nothing."""
    pair: str                        # "BASE_DIR -> OTHER_DIR"
    key: str | None = None           # the machine cost the pair asks about (hop_removal_rest_factor, ...)
    value: float | None = None       # what it measured; None when it teaches nothing
    tag: str = ""                    # the hop removed, or the path's shape the value is kept under
    why: str = ""                    # what was learned, or why not, in a line a user reads
    drift: float | None = field(default=None, repr=False)

    def as_dict(self) -> dict:
        return {"pair": self.pair, "cost": self.key, "value": self.value, "kept_under": self.tag or None,
                "why": self.why}


def _foreign(base, target) -> str:
    """Which run had another load beside it (a machine cost is learned on a machine to itself), or ""."""
    from pathprof.analysis.predict_inputs import LEARN_MAX_FOREIGN_CPUS, beside_another_load
    for name, b in (("the base", base), ("the other", target)):
        if beside_another_load(b):
            return (f"another load used {b.foreign_cpus:.2f} CPUs beside {name} run (a machine cost is learned "
                    f"from runs with the machine to themselves, below {LEARN_MAX_FOREIGN_CPUS:.2f})")
    return ""


def _busy(b) -> str:
    return f"{b.clients} clients, {b.regime}, its own processes on {b.own_cpus:.2f} of {b.ncpu:.2f} CPUs"


def pair_lesson(base_rd, base_summary, target_rd, target_summary) -> PairLesson:
    """What a pair of runs says of the machine, without remembering it: when the second run is the first's path
    without one of its hops, the ratio the rest of the path ran at (analysis.hop_removal); when it is the same
    path at another client count, both saturating the CPUs, how its CPU per transaction grew with the processes
    interleaved (analysis.interleave); with fewer clients than CPUs, a lone client's work (analysis.lone_client)."""
    from pathprof.analysis import hop_removal, interleave, lone_client
    from pathprof.analysis.predict import base_of
    from pathprof.analysis.run_model import Summary
    from pathprof.analysis.speed import sampled_ratio
    lesson = PairLesson(f"{base_rd.path} -> {target_rd.path}")
    base, target = base_of(base_rd, base_summary), base_of(target_rd, target_summary)
    gone = hop_removal.hops_gone(base.cpu, target.cpu)
    if set(target.hops) - set(base.hops) or base_rd.run.topology.name != target_rd.run.topology.name:
        lesson.why = "not one path (another topology, or a hop added)"
        return lesson
    if not _same_workload(base_summary, target_summary):
        lesson.why = "another workload (it moves the rest's cost too)"
        return lesson
    # the machine's own drift between the two runs (their speed samples) is not the hop's: taken out
    drift = lesson.drift = sampled_ratio(*(Summary.of(x).doc.get("host") for x in (base_summary, target_summary)))
    if gone:
        lesson.key, lesson.tag = hop_removal.KEY, "+".join(gone)
        lesson.value = hop_removal.measured_ratio(base, target, gone, drift)
        asked = (f"both runs at one client count, the other saturating the CPUs and the base too or held back by "
                 f"the hop (base: {_busy(base)}; other: {_busy(target)})")
    elif min(base.clients, target.clients) < min(base.ncpu, target.ncpu):
        # one run with fewer clients than CPUs: a lone client's path work against the loaded run's
        lo, hi = sorted((base, target), key=lambda b: b.clients)
        lone_drift = drift if lo is target or not drift else 1 / drift     # the lone run's slowdown
        lesson.key, lesson.tag = lone_client.KEY, interleave.shape(base.hops)
        lesson.value = lone_client.measured_factor(hi, lo, lone_drift)
        asked = f"one run loading the CPUs, the other idling them (the loaded: {_busy(hi)}; the lone: {_busy(lo)})"
    else:
        lesson.key, lesson.tag = interleave.KEY, interleave.pair_shape(base, target)
        lesson.value = interleave.measured_exponent(base, target, drift)
        asked = (f"both runs saturating the CPUs, their client counts apart (base: {_busy(base)}; "
                 f"other: {_busy(target)})")
    if lesson.value is not None:
        lesson.why = f"{lesson.key} {lesson.value:.4g} ({lesson.tag})"
    else:
        lesson.why = _foreign(base, target) or f"the pair does not measure {lesson.key}: it needs {asked}"
    return lesson


def learn_from_pair(base_rd, base_summary, target_rd, target_summary, path: Path = PATH,
                    lessons: list | None = None) -> float | None:
    """After a comparison or a sweep: what the pair measures of the machine (pair_lesson), remembered with the
    last pairs of its kind; never fails the comparison. What was learned (the ratio, the exponent), or None;
    `lessons` gets the PairLesson (what was learned or why not), for the comparison to say."""
    from pathprof.analysis import hop_removal
    try:
        lesson = pair_lesson(base_rd, base_summary, target_rd, target_summary)
        if lesson.value is not None:
            doc = current(path)
            at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            # each kept with its pair, the machine's drift it was cleared of, and its hop (or the path's hops)
            doc[lesson.key] = hop_removal.remembered(doc.get(lesson.key), lesson.value, lesson.pair, at, lesson.tag,
                                                     lesson.drift)
            _write(doc, path)
    except Exception as e:  # noqa: BLE001 - a pair that cannot be read costs the next prediction, not this comparison
        lesson = PairLesson(f"{base_rd.path} -> {target_rd.path}", why=f"the pair could not be read or kept: {e}")
    if lessons is not None:
        lessons.append(lesson)
    return lesson.value


def learn_from_check(base_rd, base_summary, target_rd, target_summary, row: dict, path: Path = PATH) -> float | None:
    """After a comparison or a sweep: how far the prediction `row` (analysis.predict.predict_for, from the first run)
    missed the other run, remembered for the bands of later predictions (analysis.prediction_misses) when the pair
    asked one of its questions of one path and workload, without another load beside either run. The miss (%), or
    None when not remembered; never fails the comparison."""
    from pathprof.analysis import prediction_misses
    from pathprof.analysis.predict import base_of
    from pathprof.analysis.predict_inputs import beside_another_load
    try:
        miss, asked = (row or {}).get("error_pct"), (row or {}).get("question")
        if miss is None or asked not in prediction_misses.QUESTIONS:
            return None
        if not _same_workload(base_summary, target_summary):
            return None
        base, target = base_of(base_rd, base_summary), base_of(target_rd, target_summary)
        if beside_another_load(base, target):
            return None               # another load's effect, not the model's miss
        doc = current(path)
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        key = prediction_misses.KEY
        doc[key] = prediction_misses.remembered(doc.get(key), float(miss), asked, base.hops,
                                                f"{base_rd.path} -> {target_rd.path}", at)
        _write(doc, path)
    except Exception:  # noqa: BLE001 - a pair that cannot be read costs the next band, not this comparison
        return None
    return float(miss)
