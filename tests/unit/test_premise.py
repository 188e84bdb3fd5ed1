"""tests/premise.py: which real runs the suite makes again, and how many times."""
import json

import premise


def doc(latency=0.5, cpu=-0.2, steal=None, notes=()):
    d = {"run_dir": "/tmp/x", "closure": {"latency_error_pct": latency, "cpu_error_pct": cpu}, "notes": list(notes)}
    if steal is not None:
        d["steal"] = {"pct": steal}
    return d


def test_a_run_that_closes_on_its_own_cpus_stands():
    assert premise.miss(doc()) is None
    assert premise.miss(doc(latency=None, cpu=None)) is None          # probes off: nothing to judge
    assert premise.miss(doc(latency=-4.9, steal=1.9)) is None


def test_steal_or_a_missed_closure_is_named():
    assert premise.miss(doc(steal=2.5)) == ("steal", "the hypervisor took 2.5 % of the CPUs")
    assert premise.miss(doc(latency=9.46)) == ("closure", "closure latency +9.46 %")
    assert premise.miss(doc(latency=9.46, notes=["THE PATH BROKE DURING THIS RUN: x"])) is None


def test_remakes_are_bounded_per_kind_and_only_for_runs(monkeypatch):
    monkeypatch.setattr(premise, "_LOCAL", [])                 # this session's own list stays its own
    monkeypatch.setattr(premise, "wait_for_own_cpus", lambda: 0.0)
    monkeypatch.setattr(premise.lanes, "session_id", lambda: None)
    remakes: dict = {}
    bad = json.dumps(doc(latency=12.0))
    assert premise.should_remake(bad, ["report", "--json"], remakes) is None
    assert premise.should_remake(bad, ["run", "-t", "nic"], remakes) is None       # not a document
    assert premise.should_remake(json.dumps(doc(steal=30.0)), ["run", "--probes", "off", "--json"], remakes) is None
    assert "closure latency +12.00 %" in premise.should_remake(bad, ["run", "--json"], remakes)
    assert premise.should_remake(bad, ["run", "--json"], remakes) is None           # once for a closure
    stolen = json.dumps(doc(steal=5.0))
    assert premise.should_remake(stolen, ["run", "--json"], remakes)
    for _ in range(premise.MAX_REMAKES["steal"] - 1):
        assert premise.should_remake(stolen, ["run", "--json"], remakes)
    assert premise.should_remake(stolen, ["run", "--json"], remakes) is None        # a bounded number for steal
    assert premise.summary().count("made again") == 1 + premise.MAX_REMAKES["steal"]


def test_a_mild_steal_is_made_again_once(monkeypatch):
    """2.0-2.7 % in five tries in a row (ci51b): a steal that mild outlasts the calm waited for, and is judged."""
    monkeypatch.setattr(premise, "_LOCAL", [])                 # this session's own list stays its own
    monkeypatch.setattr(premise, "wait_for_own_cpus", lambda: 0.0)
    monkeypatch.setattr(premise.lanes, "session_id", lambda: None)
    remakes: dict = {}
    mild = json.dumps(doc(steal=premise.MILD_STEAL_PCT - 1.5))
    assert premise.should_remake(mild, ["run", "--json"], remakes)
    assert premise.should_remake(mild, ["run", "--json"], remakes) is None
    # a compare is as stolen as its worst run: one heavy run among mild ones is made again as heavy
    heavy = json.dumps({"runs": [doc(steal=2.5), doc(steal=premise.MILD_STEAL_PCT + 5)], "explanations": []})
    assert premise.should_remake(heavy, ["compare", "--json"], remakes)


def test_when_every_try_was_stolen_from_the_least_stolen_is_judged():
    from types import SimpleNamespace as Out
    tries = [Out(stdout=json.dumps(dict(doc(steal=s), run_dir=f"/tmp/{s}"))) for s in (18.0, 4.5, 43.0)]
    assert premise.least_stolen(tries) is tries[1]
    closing = Out(stdout=json.dumps(doc()))                  # the last try stands when it was not stolen from
    assert premise.least_stolen(tries[:2] + [closing]) is closing
    missed = Out(stdout=json.dumps(doc(latency=12.0)))       # nor is a stolen try preferred to a closure miss
    assert premise.least_stolen(tries[:2] + [missed]) is missed


def test_a_compare_is_made_again_for_any_of_its_runs(monkeypatch):
    monkeypatch.setattr(premise, "_LOCAL", [])
    monkeypatch.setattr(premise, "wait_for_own_cpus", lambda: 0.0)
    monkeypatch.setattr(premise.lanes, "session_id", lambda: None)
    compared = {"runs": [doc(), dict(doc(steal=9.8), run_dir="/tmp/pool1")], "explanations": []}
    line = premise.should_remake(json.dumps(compared), ["compare", "a", "b", "--json"], {})
    assert line and "9.8 %" in line and "/tmp/pool1" in line
    assert premise.should_remake(json.dumps({"runs": [doc(), doc()]}), ["compare", "--json"], {}) is None
    assert [d["run_dir"] for d in premise.run_docs(compared)] == ["/tmp/x", "/tmp/pool1"]


def test_the_wait_for_a_calm_host_is_bounded():
    t0 = premise.time.monotonic()
    waited = premise.wait_for_own_cpus(limit_s=1.5)
    assert 1.0 <= waited <= premise.time.monotonic() - t0 <= 3.5      # at least one second's sample


def test_a_remake_waits_for_calm_seconds_in_a_row(monkeypatch):
    """One calm second between bursts is not a calm host: CALM_SECONDS in a row are (ci42d: remade after 1 s)."""
    shares = iter([5.0, 0.0, 0.0, 9.0, 0.0, 0.0, 0.0, 0.0])
    looked = []
    monkeypatch.setattr(premise, "_steal_share", lambda s: looked.append(s) or next(shares))
    premise.wait_for_own_cpus(limit_s=60.0)
    assert len(looked) == 4 + premise.CALM_SECONDS == 7


def test_a_session_stops_remaking_for_steal_after_its_budget(monkeypatch):
    """A host that steals from every run: remakes do not help and would take the suite past its time."""
    monkeypatch.setattr(premise, "_LOCAL", [])
    monkeypatch.setattr(premise, "wait_for_own_cpus", lambda: 0.0)
    monkeypatch.setattr(premise.lanes, "session_id", lambda: None)
    monkeypatch.setattr(premise, "SESSION_STEAL_REMAKES", 4)
    stolen = json.dumps(doc(steal=40.0))
    made = [premise.should_remake(stolen, ["run", "--json"], {}) for _ in range(6)]   # each a new run's remakes
    assert [bool(m) for m in made] == [True] * 4 + [False] * 2, made
    assert premise.should_remake(json.dumps(doc(latency=12.0)), ["run", "--json"], {})   # closure: its own kind


def test_a_judged_run_stolen_beyond_the_bound_fails_saying_so():
    import pytest
    premise.assert_not_stolen(dict(doc(steal=5.0), run_dir="/tmp/a"), dict(doc(), run_dir="/tmp/b"))
    with pytest.raises(AssertionError, match="premise: the hypervisor took"):
        premise.assert_not_stolen(dict(doc(steal=17.2), run_dir="/tmp/a"), dict(doc(), run_dir="/tmp/b"))


def test_two_runs_apart_in_foreign_load_are_named():
    """Foreign CPUs are a run's `other` CPU at its rate: 0.54 µs a transaction at a 34.9-µs cycle is 0.015 CPUs
    (a quiet 1-client loopback run); a qemu guest beside one run of a pair is about one CPU."""
    def run(other, cycle, clients=1):
        return {"clients": clients, "closure": {"cycle_us": cycle},
                "cpu": [{"component": "backend.user", "us_per_txn": 9.0}, {"component": "other", "us_per_txn": other}]}
    quiet, busy = run(0.54, 34.9), run(200.0, 220.0)
    assert abs(premise.foreign_cpus(quiet) - 0.0155) < 1e-3
    assert abs(premise.foreign_cpus(run(10.0, 400.0, clients=16)) - 0.4) < 1e-9       # per client cycle
    assert premise.foreign_apart(quiet, run(8.0, 330.0)) is None                      # a capped run, as quiet
    assert "0.02 CPUs beside one run, 0.91 beside the other" in premise.foreign_apart(quiet, busy)
    assert premise.foreign_cpus({"closure": {}}) == 0.0                               # probes off: nothing known


def test_a_command_teaching_a_file_of_its_own_is_made_until_its_premise_holds(monkeypatch):
    monkeypatch.setattr(premise, "_LOCAL", [])
    monkeypatch.setattr(premise, "wait_for_own_cpus", lambda: 0.0)
    monkeypatch.setattr(premise.lanes, "session_id", lambda: None)
    monkeypatch.setattr(premise.truth, "record", lambda *a: None)
    made = []

    class Out:                       # what stolen_pct reads: a `run --json` output
        def __init__(self, steal):
            self.stdout = json.dumps({"steal": {"pct": steal}, "closure": {}})

    def make(attempt):
        made.append(attempt)
        return Out([9.0, 0.5][attempt]), f"runs-{attempt}"
    attempt, result = premise.made_until_it_holds(make, premise.steal_missed)
    assert (attempt, made) == (1, [0, 1]) and premise.steal_missed(result) is None
    assert len(premise._LOCAL) == 1 and "9.0 %" in premise._LOCAL[0] and "runs-0" in premise._LOCAL[0]
    # a premise that never holds: the last try is returned for the test to judge (and fail on), remakes bounded
    attempt, result = premise.made_until_it_holds(lambda a: (a, f"r{a}"), lambda r: ("regime", "not cpu-bound"), 2)
    assert (attempt, result) == (2, 2) and len(premise._LOCAL) == 3
