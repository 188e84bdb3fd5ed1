"""CPU quotas for real (#35.1): the same 1-client loopback path with and without a CFS bandwidth limit on one of its
processes (a pp- cgroup: `run --cpu-quota`). Ground truth: the quota is the whole difference, so the time the
throttled process waited for its group's next period must be a stage of its own (`throttled.<process>`, not
run-queue or queue time on idle CPUs), carry the gap, be named in the explanation with its cgroup and quota, and
agree with the cgroup's own count (cpu.stat). First measured (2026-11-27, loopback, 1 client, always on, quota
5 ms per 100 ms on the server): throttled.backend 277 µs of a 297-µs gap (93 %), cpu.stat 77 % of the time
throttled against the probes' 86 %; the closure +1.7 % (-5.3 % once with the default windows: a cycle made of
100-ms periods is coarse against 0.5-s windows)."""
import json

import premise
import pytest
from conftest import machine_state, run_pathprof
from truth import record

pytestmark = pytest.mark.integration
QUOTA = "5/100"          # 5 ms of CPU every 100 ms: a backend serving one client needs far more


def _run(runs_dir, *extra, topology="loopback") -> dict:
    cp = run_pathprof("run", "--topology", topology, "--clients", "1", "--duration", "3", "--probe-duty", "100",
                      *extra, "--json", "--no-live", runs_dir=runs_dir, check=True, timeout=300)
    return json.loads(cp.stdout)


def _stage(doc, name) -> float:
    return sum(s["us_per_txn"] for s in doc["stages"] if s["name"] == name and not s.get("parent"))


def _pair(runs_dir, quota, topology="loopback") -> tuple[dict, dict]:
    """The path without and with the quota, one right after the other; the pair is made again once when foreign load
    was beside one run and not the other (tests/premise.py: the gap would be the machine's, not the quota's); a gap
    judged after that says so when it fails. (A base shared by the module's tests was made ~40 s before the client's
    capped run: CI of 07eed79.)"""
    for attempt in (1, 2):
        base = _run(runs_dir, topology=topology)
        capped = _run(runs_dir, "--cpu-quota", quota, topology=topology)
        apart = premise.foreign_apart(base, capped)
        if not apart or attempt == 2:
            break
        premise.note_remake("foreign", apart, capped["run_dir"])
    premise.assert_not_stolen(base, capped)
    capped["premise"] = apart
    return base, capped


@pytest.mark.parametrize("who,proc", [("server", "backend"), ("client", "pgbench")])
def test_a_quota_is_a_stage_named_with_its_cgroup_and_checked_against_it(who, proc, tmp_path):
    before = machine_state()
    base, capped = _pair(tmp_path / "runs", f"{who}={QUOTA}")
    assert machine_state() == before                   # the pp- cgroup is gone with the run
    # the premise: the quota bit (the cgroup's own count says its group was throttled in most periods)
    (q,) = capped["cpu_quotas"]
    assert q["roles"] == [proc] and q["quota_us"] == 5000 and q["period_us"] == 100000, q
    assert q["nr_throttled"] >= 0.5 * q["nr_periods"] > 0, q
    # the two independent sources of the throttled time agree (one thread of the group runnable at a time)
    record(f"{who}: probes / cpu.stat throttled share", q["probes_throttled_share"] / q["cgroup_throttled_share"],
           "0.65 ... 1.5")
    assert q["single_thread"] and q["agrees"], q
    # the wait is its own stage, the largest, and the view still closes (100-ms periods against the run: ±8 %)
    gap = capped["closure"]["cycle_us"] - base["closure"]["cycle_us"]
    throttled = _stage(capped, f"throttled.{proc}")
    record(f"{who}: throttled / gap", throttled / gap, ">= 0.7")
    assert throttled >= 0.7 * gap > 0, (throttled, gap, capped["premise"], capped["stages"])
    assert abs(capped["closure"]["latency_error_pct"]) <= 8, capped["closure"]
    assert not any(s["name"].startswith("throttled.") for s in base["stages"]), base["stages"]
    # the explanation: one cause, the CPU quota, named with its cgroup and its quota
    d = json.loads(run_pathprof("diff", base["run_dir"], capped["run_dir"], "--json", check=True).stdout)
    e = d["explanations"][0]
    top = e["causes"][0]
    assert top["name"] == "cpu quota" and f"throttled.{proc}" in top["items"], e["causes"]
    assert q["cgroup"] in top["detail"] and "5 ms per 100 ms" in top["detail"], top
    # the report says which cgroup and quota, ranked or not: on a quiet machine the capped run also loses the
    # base run's idle exits and runs its own work faster, so its parts can outgrow the gap (not ranked, CI r6)
    text = " ".join(run_pathprof("diff", base["run_dir"], capped["run_dir"], check=True).stdout.split())
    assert f"cpu quota: cgroup {q['cgroup']} (5 ms per 100 ms" in text, text[-2000:]
    assert e.get("ranked") is False or "the CPU quota of cgroup" in text, text[-2000:]


def test_a_quota_on_a_pooler_is_its_own_stage(tmp_path):
    """`--cpu-quota hop=`: the path's pooler capped (pgbouncer, one thread), the wait is `throttled.pgbouncer`, checked
    against cpu.stat, named in the explanation. A path without a hop refuses it before anything is made."""
    before = machine_state()
    base, capped = _pair(tmp_path / "runs", f"hop={QUOTA}", topology="pgbouncer")
    assert machine_state() == before
    (q,) = capped["cpu_quotas"]
    assert q["roles"] == ["pgbouncer"] and q["cgroup"].endswith("-cpu-hop"), q
    assert q["nr_throttled"] >= 0.5 * q["nr_periods"] > 0 and q["single_thread"] and q["agrees"], q
    record("hop: probes / cpu.stat throttled share", q["probes_throttled_share"] / q["cgroup_throttled_share"],
           "0.65 ... 1.5")
    gap = capped["closure"]["cycle_us"] - base["closure"]["cycle_us"]
    throttled = _stage(capped, "throttled.pgbouncer")
    record("hop: throttled / gap", throttled / gap, ">= 0.7")
    assert throttled >= 0.7 * gap > 0, (throttled, gap, capped["premise"], capped["stages"])
    assert abs(capped["closure"]["latency_error_pct"]) <= 8, capped["closure"]
    d = json.loads(run_pathprof("diff", base["run_dir"], capped["run_dir"], "--json", check=True).stdout)
    e = d["explanations"][0]
    quota = {c["name"]: c for c in e["causes"]}.get("cpu quota")
    assert quota and "throttled.pgbouncer" in quota["items"] and q["cgroup"] in quota["detail"], e["causes"]
    bad = run_pathprof("run", "--topology", "loopback", "--cpu-quota", "hop=5/100", "--duration", "1", "--no-live",
                       runs_dir=tmp_path / "bad")
    assert bad.returncode == 2 and "has no hop" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    assert machine_state() == before
