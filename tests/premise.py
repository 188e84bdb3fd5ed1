"""The premise of a real run's figures in the suite: a machine that was its own while the run measured. On this
kind of machine (2 CPUs, a VM on a shared host, the other lane's runs beside) a run now and then is disturbed:
the hypervisor takes its CPUs for ms at a time (steal), or a burst elsewhere lands inside its 2-s window, and its
views miss their closure by 6-13 % while the same path closes within 1-4 % in every other run (CI rounds of
2026-11-27: a 1-client -C nic run at half its rate with every stage's p99 in ms, +9.46 %; a merged two-agent run
+10.56 %). Such a run is made again (`pathprof run --json` through conftest.run_pathprof), loudly: each remake is
printed at the end of the session and recorded for bench/truth_trials. A product regression misses in the second
run too and fails the test; a disturbed machine's misses are independent and rarely come twice. A cell that misses
its first try in round after round is not weather (the summary shows it): measure it with bench/truth_trials.

  steal     the hypervisor took >= STEAL_PCT of the CPUs' time (analysis.steal): made again up to five times (once
            when it took under MILD_STEAL_PCT), each after three calm seconds in a row (a minute at most), and when
            every try was stolen from, the least stolen is judged
  closure   a view outside +-CLOSURE_PCT, the product's promise: made again once"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import lanes
import truth

STEAL_PCT = 2.0
# what a judged run may still have had stolen (the least stolen try of a bad hour): below it, the ground truths held
# in every CI round; above it they do not measure the path (ci42d: 17 % and 19 %, a factor not found, closure -25 %)
JUDGED_STEAL_MAX_PCT = 10.0
CLOSURE_PCT = 5.0
# 5, not 3: a host's steal once outlasted three tries of four -C runs in one CI round (18-43 %, ci41a), and in
# ci42d the least stolen of four tries still had 17 % (foreign_load's run alone) and 19 % (a lossy compare)
MAX_REMAKES = {"steal": 5, "closure": 1}
# A steal under this is remade once, not five times: in ci51b five tries in a row of one backend_io run had 2.0-2.7 %
# (40 s of remakes; a host's steal at that level lasts longer than the calm it waits for), and a run judged with up
# to JUDGED_STEAL_MAX_PCT held its ground truths in every CI round
MILD_STEAL_PCT = 4.0
MAX_MILD_STEAL_REMAKES = 1
CALM_WAIT_S = 60.0    # before a remake for steal: wait (this long at most) for CALM_SECONDS in a row with less steal
CALM_SECONDS = 3      # a 3-s run needs more than one calm second (ci42d: remade after 1 s of calm, stolen again)
# a host that steals from every run (ci42e: a 1-client run 41-44 % stolen in five tries, each after 3 calm seconds:
# the steal came with the run's own load) is not helped by remakes, and they would take the suite past its time:
# after this many remakes for steal in a session, a stolen run is judged as it is
SESSION_STEAL_REMAKES = 60
_LOCAL: list[str] = []       # without lanes: this process's remakes


def miss(doc: dict) -> tuple[str, str] | None:
    """(kind, why) when a run document's premise did not hold, else None."""
    steal = (doc.get("steal") or {}).get("pct")
    if steal is not None and steal >= STEAL_PCT:
        return "steal", f"the hypervisor took {steal:.1f} % of the CPUs"
    if any(str(n).startswith("THE PATH BROKE") for n in doc.get("notes") or []):
        return None          # a broken path's run is the test's subject, not a disturbed one
    cl = doc.get("closure") or {}
    bad = {v: cl.get(f"{v}_error_pct") for v in ("latency", "cpu")}
    bad = {v: e for v, e in bad.items() if isinstance(e, (int, float)) and abs(e) > CLOSURE_PCT}
    if bad:
        return "closure", "closure " + ", ".join(f"{v} {e:+.2f} %" for v, e in bad.items())
    return None


MAKERS = ("run", "compare")     # the commands that make runs (compare: each of its runs)


def assert_not_stolen(*runs: dict) -> None:
    """A test's premise, asserted: no run it judges (after the remakes) had more than JUDGED_STEAL_MAX_PCT stolen
    by the hypervisor, said as such rather than as the figure the steal bent."""
    stolen = {r.get("run_dir"): (r.get("steal") or {}).get("pct") or 0.0 for r in runs}
    assert max(stolen.values()) < JUDGED_STEAL_MAX_PCT, f"premise: the hypervisor took {stolen} % of the CPUs"


def run_docs(doc: dict) -> list[dict]:
    """The run documents in a `run`, merged run or `compare` document."""
    return [d for d in (doc, *(doc.get("runs") or [])) if isinstance(d, dict) and "closure" in d]


def should_remake(stdout: str, args, remakes: dict) -> str | None:
    """Why a successful `run --json` or `compare --json` must be made again (counting into `remakes`), or None."""
    if not args or args[0] not in MAKERS or "--json" not in args:
        return None
    if any(a == "--probes" and b == "off" for a, b in zip(args, args[1:])):
        return None      # no views to disturb: such a run tests something else (a remake of test_pg_template's
        # first run reused the template its stolen-from try had built: ci41y)
    try:
        doc = json.loads(stdout)
    except ValueError:
        return None
    return remake_reason(doc, remakes) if isinstance(doc, dict) else None


def remake_reason(doc: dict, remakes: dict) -> str | None:
    """Why the run(s) behind `doc` must be made again (counting into `remakes`), or None."""
    found = next(((d, m) for d in run_docs(doc) for m in [miss(d)] if m), None)
    if found is None:
        return None
    made, (kind, why) = found
    if remakes.get(kind, 0) >= MAX_REMAKES[kind]:
        return None
    mild = kind == "steal" and worst_steal(doc) < MILD_STEAL_PCT
    if mild and remakes.get(kind, 0) >= MAX_MILD_STEAL_REMAKES:
        return None
    if kind == "steal" and _session_count(STEAL_MARK) >= SESSION_STEAL_REMAKES:
        return None
    remakes[kind] = remakes.get(kind, 0) + 1
    if kind == "steal":
        why += f" (then {wait_for_own_cpus():.0f} s for the host to calm)"
    return note_remake(kind, why, made.get("run_dir"))


def note_remake(kind: str, why: str, run_dir) -> str:
    """Record a remake (printed at the session's end, counted for bench/truth_trials); the line."""
    test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" ", 1)[0]
    line = f"{test}: {why} in {run_dir}: made again"
    truth.record(f"premise.{kind}", 1.0, "remade")
    if lanes.session_id():
        with open(lanes.lanes_file(".remade"), "a") as f:
            f.write(line + "\n")
    else:
        _LOCAL.append(line)
    return line


# A diff's ground truth (the injected cost is the whole difference) needs its two runs on the same machine: the other
# lane's runs, or a guest's qemu, beside one of them and not the other bend the gap (CI of 07eed79: a 1-client base
# made ~40 s before its capped run was slower than it, the quota's 182 µs a transaction against a gap of -24 µs).
# In CPUs of foreign load (the runs' own `other` component): a quiet 1-client run has ~0.02, a qemu guest beside ~1.
FOREIGN_CPUS_APART = 0.5


def foreign_cpus(doc: dict) -> float:
    """The CPUs other processes used while a run measured (its `other` CPU component at its rate)."""
    other = sum(c.get("us_per_txn") or 0.0 for c in doc.get("cpu") or [] if c.get("component") == "other")
    cycle, clients = (doc.get("closure") or {}).get("cycle_us"), doc.get("clients") or 1
    return other * clients / cycle if cycle else 0.0


def foreign_apart(a: dict, b: dict) -> str | None:
    """Why two runs to be compared did not share one machine's load, or None."""
    fa, fb = foreign_cpus(a), foreign_cpus(b)
    if abs(fa - fb) < FOREIGN_CPUS_APART:
        return None
    return f"foreign load {fa:.2f} CPUs beside one run, {fb:.2f} beside the other"


def stolen_pct(cp) -> float:
    """The worst steal share among the runs of a `run`/`compare` output (0 when it says none)."""
    try:
        return worst_steal(json.loads(cp.stdout))
    except (ValueError, TypeError, AttributeError):
        return 0.0


def worst_steal(doc: dict) -> float:
    """The worst steal share among the runs of a `run`, merged run or `compare` document."""
    return max([float((d.get("steal") or {}).get("pct") or 0.0) for d in run_docs(doc)] or [0.0])


def least_stolen(tries: list):
    """Of a command's tries (the last one kept by the remake budget), the one to judge: the last, unless it was
    stolen from and an earlier try less so; a try that missed for any other reason is never preferred to it."""
    last = tries[-1]
    if (miss_of(last) or ("", ""))[0] != "steal":
        return last
    stolen = [t for t in tries if (miss_of(t) or ("", ""))[0] == "steal"]
    return min(stolen, key=stolen_pct)


def miss_of(cp) -> tuple[str, str] | None:
    try:
        doc = json.loads(cp.stdout)
    except (ValueError, TypeError):
        return None
    if not isinstance(doc, dict):
        return None
    return next((m for d in run_docs(doc) for m in [miss(d)] if m), None)


def made_until_it_holds(make, missed, remakes: int = 2):
    """A command whose runs teach a file of their own (so not made again through conftest.run_pathprof, whose
    remakes would have taught the file with a disturbed try before the judged one began: ci43f): `make(attempt)`
    builds try `attempt` and returns (result, where its runs are); `missed(result)` says why its premise did not
    hold, (kind, why), or None. Made again up to `remakes` times, each remake noted and made after the host's
    steal calmed; the last try is returned as (attempt, result) for the test to judge, its premise asserted there."""
    for attempt in range(1 + remakes):
        result, where = make(attempt)
        why = missed(result)
        if why is None or attempt == remakes:
            return attempt, result
        note_remake(why[0], why[1], where)
        wait_for_own_cpus()
    raise AssertionError("unreachable")


def steal_missed(cp) -> tuple[str, str] | None:
    """A `run`/`compare` output's premise for steal: (kind, why) when a run had >= STEAL_PCT stolen."""
    stolen = stolen_pct(cp)
    return ("steal", f"the hypervisor took {stolen:.1f} % of the CPUs") if stolen >= STEAL_PCT else None


STEAL_MARK = "the hypervisor took"      # how a remake for steal reads (miss())


def _session_count(mark: str) -> int:
    """The session's remakes so far whose line says `mark` (both lanes')."""
    return sum(mark in line for line in (summary() or "").splitlines())


def summary() -> str | None:
    """The session's remakes, for the terminal summary (the controller's, or a run without lanes)."""
    lines = list(_LOCAL)
    if lanes.session_id():
        f = lanes.lanes_file(".remade")
        if Path(f).exists():
            lines += Path(f).read_text().splitlines()
    return "\n".join(lines) or None


def _steal_share(seconds: float) -> float:
    """The steal share of the CPUs' time over the next `seconds` (/proc/stat)."""
    def read():
        with open("/proc/stat") as f:
            vals = [int(x) for x in f.readline().split()[1:]]
        return (vals[7] if len(vals) > 7 else 0), sum(vals[:8])
    s0, t0 = read()
    time.sleep(seconds)
    s1, t1 = read()
    return 100.0 * (s1 - s0) / max(t1 - t0, 1)


def wait_for_own_cpus(limit_s: float = CALM_WAIT_S) -> float:
    """Wait until CALM_SECONDS in a row pass with the hypervisor's steal under STEAL_PCT (at most `limit_s`): a run
    made again straight into the same burst (28 %, then 12 % in a CI round's compare) proves nothing. Seconds
    waited."""
    t0, calm = time.monotonic(), 0
    while time.monotonic() - t0 < limit_s and calm < CALM_SECONDS:
        calm = calm + 1 if _steal_share(1.0) < STEAL_PCT else 0
    return time.monotonic() - t0
