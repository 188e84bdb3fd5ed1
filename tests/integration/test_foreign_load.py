"""Ground truth by injection: the same 1-client path alone and while two busy loops keep both CPUs busy.

Alone, every wakeup lands on an idle CPU, which must first leave idle (the `idle_exit` stage, tens of µs on a
VM); under foreign load the CPUs never idle, so that stage vanishes, throughput rises, the CPU view shows the
load as `other`, and the explanation must use the latency basis (the runs are limited by different things) and
put the vanished idle exits under the scheduler, each as much as its stage moved."""
import json
import os
import subprocess
import sys

import pytest
from conftest import machine_state, run_pathprof, wait_for_idle_cpus
from truth import record

pytestmark = pytest.mark.integration


def _run(runs_dir) -> dict:
    """The same settings as tests/conftest.py always_on_run("nic", 1), the run alone (shared with other modules)."""
    cp = run_pathprof("run", "--topology", "nic", "--clients", "1", "--duration", "3", "--probe-duty", "100",
                      "--json", "--no-live", runs_dir=runs_dir, check=True, timeout=300)
    return json.loads(cp.stdout)


def _per_txn(doc, kind) -> float:
    return sum(s["us_per_txn"] for s in doc["stages"] if s["name"].startswith(kind + "."))


def test_foreign_cpu_load_removes_idle_exits_and_is_explained_on_latency(runs_dir, always_on_run):
    alone = always_on_run("nic", 1)         # restores the machine itself (asserted there)
    if not _per_txn(alone, "idle_exit") > 2 * _per_txn(alone, "wakeup"):
        # the ground truth needs wakeups that find an idle CPU; a previous test still winding down, or the
        # scheduler keeping the 1-client ping-pong on one CPU, can take them away (2 runs in ~6 on 2026-11-25):
        # one more run alone, then the premise is asserted below
        busy = wait_for_idle_cpus()
        alone = _run(runs_dir)
        assert _per_txn(alone, "idle_exit") > 2 * _per_txn(alone, "wakeup"), (
            f"premise: the run alone found the CPUs busy (idle_exit {_per_txn(alone, 'idle_exit'):.2f} µs against "
            f"wakeup {_per_txn(alone, 'wakeup'):.2f} µs per transaction; the CPUs were {busy:.0f} % busy before "
            "it): something else loads this machine", alone["stages"])
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
    d = json.loads(run_pathprof("diff", alone["run_dir"], loaded["run_dir"], "--json", check=True).stdout)
    e = d["explanations"][0]
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
