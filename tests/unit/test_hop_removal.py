"""analysis.hop_removal and agent.host.machine_costs.learn_from_pair: what the rest of a path costs without a hop,
learned from a pair of runs and applied by `predict --without` (recorded runs in tests/unit/data/runs)."""
from dataclasses import replace
from pathlib import Path

import pytest
from pathprof.agent.host import machine_costs as mc
from pathprof.analysis import hop_removal as H
from pathprof.analysis import predict as P
from pathprof.analysis.rundir import RunDir
from pathprof.analysis.summary import summarize

RUNS = Path(__file__).parent / "data" / "runs"


def base(name):
    return P.base_of(RunDir.open(RUNS / name))


def test_a_hop_left_running_idle_is_off_the_path():
    """pgbouncer still runs beside a target=direct run: 0.01 µs a transaction is not a hop on the path."""
    with_hop = {"hop.pgbouncer.sys": 9.6, "hop.pgbouncer.user": 0.9, "backend.sys": 8.1}
    assert H.hops_gone(with_hop, {"hop.pgbouncer.user": 0.01, "backend.sys": 6.1}) == ("pgbouncer",)
    assert H.hops_gone(with_hop, {"backend.sys": 6.1}) == ("pgbouncer",)
    assert H.hops_gone(with_hop, {"hop.pgbouncer.sys": 4.0, "backend.sys": 6.1}) == ()       # still relaying


def test_the_machine_keeps_the_last_pairs_and_their_median():
    e = None
    for i, r in enumerate([0.72, 0.77, 0.71, 0.70, 0.9, 0.69, 0.73, 0.71]):
        e = H.remembered(e, r, f"pair {i}", "t", "pgbouncer")
    assert len(e["samples"]) == H.KEEP and e["samples"][0]["run"] == "pair 1"       # the oldest dropped
    assert e["value"] == pytest.approx(0.71) and e["run"] == "pair 7"        # 0.69 .. 0.9 (0.72 dropped)
    f, spread, src = H.factor({H.KEY: e}, ("pgbouncer",))
    assert f == pytest.approx(0.71) and spread == pytest.approx((0.9 - 0.69) / 2 / 0.71 * 100, rel=1e-3)
    assert "median of 7 pair(s)" in src and "pgbouncer removed" in src
    assert H.factor({}) == (None, 0.0, "")
    # another hop's pairs are kept beside (the last KEEP of each), and a hop's own pairs are preferred
    e = H.remembered(H.remembered(e, 0.85, "d1", "t", "docker-proxy"), 0.87, "d2", "t", "docker-proxy")
    assert len(e["samples"]) == H.KEEP + 2
    assert H.factor({H.KEY: e}, ("docker-proxy",))[0] == pytest.approx(0.86)
    f, _, src = H.factor({H.KEY: e}, ("haproxy",))                      # never seen removed: every pair
    assert f == pytest.approx(0.73) and "any hop removed" in src


def test_a_learned_ratio_prices_the_rest_and_widens_the_band():
    b = base("docker-dnat")
    sc = P.Scenario(without=("docker-proxy",))
    bare = P.apply(b, sc)
    assert any("teaches this machine its ratio" in n for n in bare.notes)
    e = H.remembered(H.remembered(None, 0.70, "a", "t", "docker-proxy"), 0.76, "b", "t", "docker-proxy")
    taught = P.apply(replace(b, machine={**b.machine, H.KEY: e}), sc)
    assert sum(taught.cpu.values()) == pytest.approx(0.73 * sum(bare.cpu.values()))
    assert taught.band_pct > b.band_pct and taught.band_parts["hop_removal_ratio_pct"] == pytest.approx(4.1, abs=0.1)
    assert any("x 0.73" in n for n in taught.notes)
    rows = [P.predict(replace(b, machine={**b.machine, H.KEY: e}), [16], sc)[0], P.predict(b, [16], sc)[0]]
    assert rows[0]["tps"] > rows[1]["tps"]
    assert P.apply(replace(b, machine={H.KEY: e}), P.Scenario()).cpu == P.apply(b, P.Scenario()).cpu   # no hop gone


def test_a_pair_is_learned_only_when_both_runs_saturate_at_one_client_count():
    b = base("docker-dnat")
    target = replace(b, cpu={k: v * 0.5 for k, v in b.cpu.items() if not k.startswith("hop.")}, hops=[])
    rest = H.structural_rest(b, ("docker-proxy",))
    assert b.regime == "cpu-bound"                                         # the recorded run: 16 clients, 2 CPUs
    assert H.measured_ratio(b, target, ("docker-proxy",)) == pytest.approx(sum(target.cpu.values()) / rest)
    assert H.measured_ratio(replace(b, regime="latency-bound"), target, ("docker-proxy",)) is None
    assert H.measured_ratio(b, replace(target, clients=b.clients + 1), ("docker-proxy",)) is None
    assert H.measured_ratio(b, replace(target, cpu={"backend.sys": rest * 3}), ("docker-proxy",)) is None  # insane
    assert H.measured_ratio(b, target, ()) is None


def test_a_base_held_back_by_the_removed_hop_teaches_when_its_cpus_were_busy():
    """A pooler's one thread limited the base (the run latency-bound, its CPUs still busy): the removed hop was the
    limit, so the pair says what the rest costs without it. Recorded rounds: tests/unit/test_predict_rounds.py."""
    b = base("docker-dnat")
    target = replace(b, cpu={k: v * 0.5 for k, v in b.cpu.items() if not k.startswith("hop.")}, hops=[])
    want = H.measured_ratio(b, target, ("docker-proxy",))
    held = replace(b, regime="latency-bound", hop_us={"docker-proxy": 30.0}, own_cpus=0.8 * b.ncpu)
    assert H.measured_ratio(held, target, ("docker-proxy",)) == pytest.approx(want)
    assert H.measured_ratio(replace(held, own_cpus=0.6 * b.ncpu), target, ("docker-proxy",)) is None   # CPUs idled
    assert H.measured_ratio(replace(held, hop_us={}), target, ("docker-proxy",)) is None     # not the hop's limit
    assert H.measured_ratio(held, replace(target, regime="latency-bound"), ("docker-proxy",)) is None
    # another load beside either run: its own share of each CPU per transaction (CI on aad2faf: 0.33 CPUs beside
    # a base held back at 1.50 of 2) is not the hop's
    assert H.measured_ratio(replace(held, foreign_cpus=0.33), target, ("docker-proxy",)) is None
    assert H.measured_ratio(held, replace(target, foreign_cpus=0.1), ("docker-proxy",)) is None
    assert H.measured_ratio(held, replace(target, foreign_cpus=0.09), ("docker-proxy",)) == pytest.approx(want)
    assert b.own_cpus >= P.SATURATED * b.ncpu           # a cpu-bound run's own CPUs, as base_from_run judged them


def test_the_machines_own_drift_between_the_pair_is_not_taught_as_the_hops():
    b = base("docker-dnat")
    target = replace(b, cpu={k: v * 0.5 for k, v in b.cpu.items() if not k.startswith("hop.")}, hops=[])
    plain = H.measured_ratio(b, target, ("docker-proxy",))
    # the machine ran the same work 25 % slower at the target's run: a quarter of its CPU per transaction is that
    assert H.measured_ratio(b, target, ("docker-proxy",), drift=1.25) == pytest.approx(plain / 1.25)
    assert H.measured_ratio(b, target, ("docker-proxy",), drift=None) == pytest.approx(plain)
    e = H.remembered(None, plain / 1.25, "a -> b", "t", "docker-proxy", drift=1.25)
    assert e["samples"][0]["machine_drift"] == 1.25 and e["value"] == pytest.approx(plain / 1.25, abs=1e-4)


def test_learn_from_pair_writes_the_machine_file_and_refuses_another_path(tmp_path):
    rd = RunDir.open(RUNS / "docker-dnat")
    s = summarize(rd)
    path = tmp_path / "machine-costs.json"
    assert mc.learn_from_pair(rd, s, rd, s, path=path) is None            # the same run: no hop gone
    assert not path.exists()
    other = RunDir.open(RUNS / "unix")
    assert mc.learn_from_pair(rd, s, other, summarize(other), path=path) is None
    assert not path.exists()


def test_a_pair_says_what_it_taught_or_why_not(tmp_path):
    """compare and sweep print each pair's lesson (agent.host.machine_costs.pair_lesson): what the file learned, or
    why nothing, in a line the user reads."""
    from pathprof.analysis.report.render import lessons_view, render_to_string
    rd = RunDir.open(RUNS / "docker-dnat")
    s = summarize(rd)
    lessons = []
    assert mc.learn_from_pair(rd, s, RunDir.open(RUNS / "unix"), summarize(RunDir.open(RUNS / "unix")),
                              path=tmp_path / "m.json", lessons=lessons) is None
    (lesson,) = lessons
    assert lesson.value is None and "not one path" in lesson.why and lesson.pair.endswith("unix")
    text = render_to_string(lessons_view([lesson.as_dict(),
                                          {"pair": "/r/a -> /r/b", "cost": H.KEY, "value": 0.74,
                                           "kept_under": "docker-proxy", "why": f"{H.KEY} 0.74 (docker-proxy)"}]),
                            width=200)
    assert "docker-dnat → unix: nothing, not one path" in text
    assert "a → b: hop_removal_rest_factor 0.74 (docker-proxy)" in text and "/r/" not in text
    assert render_to_string(lessons_view([])).strip() == ""
