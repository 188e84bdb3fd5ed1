"""Ground truth by injection: the same 1-client path alone and while two busy loops keep both CPUs busy.

Alone, every wakeup lands on an idle CPU, which must first leave idle (the `idle_exit` stage, tens of µs on a
VM); under foreign load the CPUs never idle, so that stage vanishes, throughput rises, the CPU view shows the
load as `other`, and the explanation must use the latency basis (the runs are limited by different things) and
put the vanished idle exits under the scheduler, each as much as its stage moved."""
import json
import os
import statistics
import subprocess
import sys

import premise
import pytest
from conftest import machine_state, run_pathprof, wait_for_idle_cpus
from truth import record

pytestmark = pytest.mark.integration


def _run(runs_dir) -> dict:
    """The same settings as tests/conftest.py always_on_run("nic", 1), the run alone (shared with other modules)."""
    cp = run_pathprof("run", "--topology", "nic", "--clients", "1", "--duration", "3", "--probe-duty", "100",
                      "--json", "--no-live", runs_dir=runs_dir, check=True, timeout=300)
    return json.loads(cp.stdout)


def _diff(alone: dict, loaded: dict) -> dict:
    d = json.loads(run_pathprof("diff", alone["run_dir"], loaded["run_dir"], "--json", check=True).stdout)
    return d["explanations"][0]


def _per_txn(doc, kind) -> float:
    return sum(s["us_per_txn"] for s in doc["stages"] if s["name"].startswith(kind + "."))


@pytest.fixture(scope="module")
def alone_and_loaded(always_on_run, tmp_path_factory) -> tuple[dict, dict]:
    """The 1-client nic run alone, and the same beside a busy loop per CPU: made once, read by both tests."""
    runs_dir = tmp_path_factory.mktemp("foreign-load")
    alone = always_on_run("nic", 1)         # restores the machine itself (asserted there)
    if not _per_txn(alone, "idle_exit") > 2 * _per_txn(alone, "wakeup"):
        # the ground truth needs wakeups that find an idle CPU; a previous test still winding down, or the
        # scheduler keeping the 1-client ping-pong on one CPU, can take them away (2 runs in ~6 on 2026-11-25):
        # one more run alone, then the premise is asserted here and by the tests
        busy = wait_for_idle_cpus()
        alone = _run(runs_dir)
        assert _per_txn(alone, "idle_exit") > 2 * _per_txn(alone, "wakeup"), (
            f"premise: the run alone found the CPUs busy (idle_exit {_per_txn(alone, 'idle_exit'):.2f} µs against "
            f"wakeup {_per_txn(alone, 'wakeup'):.2f} µs per transaction; the CPUs were {busy:.0f} % busy before "
            "it): something else loads this machine", alone["stages"])
    loaded = _beside_busy_loops(runs_dir)
    # The second test's premise: beside the loops every stage's own work ran faster, the processes' and the
    # kernel's alike. By how much is the machine's (20 trials, 2026-11-28: process stages' median 0.52-0.95,
    # kernel's 0.48-0.88; two pairs of 20 left the processes within 10 %, where analysis.speed names no factor):
    # the pair is made again, at most four times, until both groups moved (in CI it took two remakes in one round
    # of three: the kernel's stages at 0.98 and 0.94); then the premise is the test's first assert
    for _ in range(4):
        moved = speedup(alone, loaded)
        if max(moved.values()) <= SPEEDUP_PREMISE:
            break
        premise.note_remake("speedup", f"own work beside busy loops only {moved} of alone", loaded["run_dir"])
        alone, loaded = _run(runs_dir), _beside_busy_loops(runs_dir)
    return alone, loaded


def _beside_busy_loops(runs_dir) -> dict:
    before = machine_state()
    n = os.cpu_count() or 2
    # bounded in time by the loop itself, and killed (the whole loop, not a wrapper around it) when done
    burn = "import time\nend = time.time() + 60\nwhile time.time() < end: pass"
    loops = [subprocess.Popen([sys.executable, "-c", burn]) for _ in range(n)]
    try:
        loaded = _run(runs_dir)
    finally:
        for p in loops:
            p.kill()
            p.wait()
    assert machine_state() == before
    return loaded


def test_foreign_cpu_load_removes_idle_exits_and_is_explained_on_latency(alone_and_loaded):
    alone, loaded = alone_and_loaded
    record("alone idle_exit / wakeup", _per_txn(alone, "idle_exit") / max(_per_txn(alone, "wakeup"), 1e-9), "> 2")
    record("loaded / alone idle_exit", _per_txn(loaded, "idle_exit") / max(_per_txn(alone, "idle_exit"), 1e-9),
           "< 0.25")
    # alone: idle exits are the bulk of waking up; loaded: (almost) none
    assert _per_txn(alone, "idle_exit") > 2 * _per_txn(alone, "wakeup"), alone["stages"]
    assert _per_txn(loaded, "idle_exit") < 0.25 * _per_txn(alone, "idle_exit"), loaded["stages"]
    cpu = {c["component"]: c["us_per_txn"] for c in loaded["cpu"]}
    assert max(cpu, key=cpu.get) == "other", cpu
    # TPS itself may go either way: the busy loops remove the idle exits but also take CPU time from pgbench and
    # the backend (8.3k -> 24.4k TPS once on this VM; 16.4k -> 15.7k on 2026-11-25): not asserted
    e = _diff(alone, loaded)
    assert e["basis"] == "latency" and "other processes' CPU load" in e["basis_reason"], e["basis_reason"]
    # Which cause leads is not the ground truth here: the loops remove the idle exits (scheduler, negative) but
    # also lengthen run-queue waits (scheduler, positive) and speed up every stage's own CPU work (a CPU that never
    # idles: network stack, backend, client all faster, #35.2), so the scheduler's net share moves with where the
    # kernel placed the loops (first cause "network stack" 66 % / "backend" 34 % in fresh-clone CI, 2026-11-27).
    # What the injection does guarantee: the idle exits that vanished are the scheduler's, each item as much as
    # its stage lost between the runs (below), and their sum is a real part of the latency gap's moves.
    sched = {c["name"]: c for c in e["causes"]}.get("scheduler")
    assert sched and {"idle_exit.backend", "idle_exit.pgbench"} <= set(sched["items"]), e["causes"]
    # the items are the two runs' own stage differences (not figures of the explanation's own): the idle exits
    # that vanished under load, each as much as its stage lost between the runs
    stage = {d["run_dir"]: {} for d in (alone, loaded)}
    for d in (alone, loaded):
        for s in d["stages"]:
            if not s.get("parent"):
                stage[d["run_dir"]][s["name"]] = stage[d["run_dir"]].get(s["name"], 0.0) + s["us_per_txn"]
    items = {i["name"]: i["delta_us_per_txn"] for i in e["items"]}
    for name in ("idle_exit.backend", "idle_exit.pgbench"):
        moved = stage[loaded["run_dir"]].get(name, 0.0) - stage[alone["run_dir"]].get(name, 0.0)
        assert moved < 0 and items[name] == pytest.approx(moved, abs=0.05 + 0.02 * abs(moved)), (name, items[name])


# the run's own processes in the CPU view (sched_switch on-CPU time, not the stages' timestamps)
_OWN_CPU = ("backend.user", "backend.sys", "pgbench.user", "pgbench.sys")
# own-work stages as analysis/speed.py takes them (recv.* is not: a CPU leaving idle is most of it alone)
_OWN_STAGES = ("wire.", "dev.", "netfilter.", "hop.", "client.", "backend.execute")


def _stage_totals(doc: dict) -> dict:
    out: dict = {}
    for s in doc["stages"]:
        if not s.get("parent"):
            out[s["name"]] = out.get(s["name"], 0.0) + s["us_per_txn"]
    return out


# both groups' own work at most this share of its time alone (analysis.speed names a factor from 0.90: a margin)
SPEEDUP_PREMISE = 0.88


def _own_ratios(alone: dict, loaded: dict) -> dict:
    a, b = _stage_totals(alone), _stage_totals(loaded)
    return {n: b[n] / a[n] for n in a if n in b and n.startswith(_OWN_STAGES) and min(a[n], b[n]) >= 0.5}


def speedup(alone: dict, loaded: dict) -> dict:
    """The median ratio (loaded / alone) of the processes' own-work stages and of the kernel's."""
    from pathprof.analysis.speed import _group
    own = _own_ratios(alone, loaded)
    return {g: round(statistics.median([r for n, r in own.items() if _group(n, "latency") == g] or [1.0]), 3)
            for g in ("process", "kernel")}


def test_a_cpu_that_never_idles_is_one_speed_factor_not_five_causes(alone_and_loaded):
    """#35.2: beside the busy loops every stage's own CPU work runs faster (CPUs that never idle stay warm: 0.63 of
    its time on 2026-11-27, ~0.65 in the issue), which split stage by stage read as backend, client, network stack
    and devices moving separately. The explanation must name it once, `cpu speed`, with its band and its share."""
    alone, loaded = alone_and_loaded
    # the premise: alone, wakeups find idle CPUs; loaded, they do not (as the test above asserts)
    assert _per_txn(alone, "idle_exit") > 2 * _per_txn(alone, "wakeup"), alone["stages"]
    assert _per_txn(loaded, "idle_exit") < 0.25 * _per_txn(alone, "idle_exit"), loaded["stages"]
    e = _diff(alone, loaded)
    sf = e["speed_factor"]
    a, b = _stage_totals(alone), _stage_totals(loaded)
    own = _own_ratios(alone, loaded)
    record("cpu speed ratio", sf["ratio"] if sf else None, "< 0.9")
    moved = speedup(alone, loaded)
    for group, ratio in moved.items():
        record(f"cpu speed ratio, {group} stages' median", ratio, f"<= {SPEEDUP_PREMISE} (premise)")
    # the premise: neither run stretched by the hypervisor (ci42d: the run alone 17 % stolen after every remake, its
    # stages stretched unevenly, and no common factor), said as such rather than as a missing factor
    premise.assert_not_stolen(alone, loaded)
    assert max(moved.values()) <= SPEEDUP_PREMISE, (
        f"premise: beside busy loops this machine's own work ran at {moved} of its time alone, in five pairs: "
        f"a factor needs both groups at <= {SPEEDUP_PREMISE} (CPUs that idle shallowly gain little by never idling)")
    assert sf is not None, ("no common factor", own)
    # faster, the band on one side of 1 and around the median, over the run's own-work stages
    assert sf["ratio"] <= 0.9 and sf["low"] <= sf["ratio"] <= sf["high"] < 1.0, sf
    assert sf["stages_n"] == len(own) >= 4, (sf, own)
    assert sf["ratio"] == pytest.approx(statistics.median(own.values()), abs=0.002), (sf, own)   # their median
    # its part is each own-work stage's baseline × (ratio − 1), and its share is that part of the measured gap
    part = sum(a[n] * (sf["ratio"] - 1.0) for n in a if n in b and n.startswith(_OWN_STAGES))
    assert sf["delta_us_per_txn"] == pytest.approx(part, rel=0.01, abs=0.05), (sf, part)
    causes = {c["name"]: c for c in e["causes"]}
    assert causes["cpu speed"]["delta_us_per_txn"] == sf["delta_us_per_txn"] < 0, causes["cpu speed"]
    if e["ranked"]:
        assert sf["share_pct"] == pytest.approx(part / e["gap_us_per_txn"] * 100.0, abs=0.2), (sf, e["gap_us_per_txn"])
        assert causes["cpu speed"]["share_pct"] == sf["share_pct"], causes["cpu speed"]
    else:
        # the loops may also lengthen the run-queue waits by more than the gap (the loaded run slower, +18.8 µs,
        # and the scheduler's share over 150 %: fresh-clone CI, 2026-11-28): not rankable, so no cause, the
        # factor included, keeps a share that would mislead; its part in µs is still asserted above
        assert e["verdict"] in ("smaller than its parts", "within noise"), e["verdict"]
        assert sf["share_pct"] is None and causes["cpu speed"]["share_pct"] is None, (sf, causes["cpu speed"])
    # one cause, not five: what the factor leaves of the backend, the client, the network stack and the devices
    # is each smaller than the factor itself
    for name in ("backend", "client", "network stack", "devices"):
        left = abs(causes.get(name, {"delta_us_per_txn": 0.0})["delta_us_per_txn"])
        assert left < abs(sf["delta_us_per_txn"]), (name, left, sf)
    # an independent measure agrees on the direction: the run's own CPU per transaction in the CPU view (on-CPU
    # time from the scheduler's switches, not the stages' timestamps) fell too
    cpu_a = sum(c["us_per_txn"] for c in alone["cpu"] if c["component"] in _OWN_CPU)
    cpu_b = sum(c["us_per_txn"] for c in loaded["cpu"] if c["component"] in _OWN_CPU)
    record("cpu view own CPU loaded / alone", cpu_b / cpu_a, "< 1")
    assert cpu_b < cpu_a, (cpu_a, cpu_b)
