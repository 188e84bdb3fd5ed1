"""analysis.interleave and its learning (agent.host.machine_costs.learn_from_pair): a transaction's CPU at another
client count, by the exponent this machine measured from pairs of runs of one path (recorded runs in
tests/unit/data/runs)."""
import math
from dataclasses import replace
from pathlib import Path

import pytest
from pathprof.agent.host import machine_costs as mc
from pathprof.analysis import hop_removal as H
from pathprof.analysis import interleave as I
from pathprof.analysis import predict as P
from pathprof.analysis.rundir import RunDir
from pathprof.analysis.summary import summarize

RUNS = Path(__file__).parent / "data" / "runs"


def base(name):
    return P.base_of(RunDir.open(RUNS / name))


def taught(*pairs):
    """A machine entry with these (exponent, shape) pairs, as learn_from_pair keeps them."""
    e = None
    for i, (x, shape) in enumerate(pairs):
        e = H.remembered(e, x, f"pair {i}", "t", shape)
    return {I.KEY: e}


def test_processes_per_cpu_counts_backends_client_threads_and_hops():
    assert I.processes_per_cpu(16, 2) == pytest.approx((16 + 2) / 2)
    assert I.processes_per_cpu(4, 2, hops=1) == pytest.approx((4 + 2 + 1) / 2)
    assert I.processes_per_cpu(1, 2) == pytest.approx(1.0)


def test_a_pair_teaches_an_exponent_only_when_both_runs_saturate_the_cpus():
    b = base("docker-dnat")
    assert b.regime == "cpu-bound" and b.clients == 16 and b.hops == ["docker-proxy"]
    at4 = replace(b, clients=4, cpu={k: v * 0.8 for k, v in b.cpu.items()})
    p16, p4 = I.processes_per_cpu(16, b.ncpu, 1), I.processes_per_cpu(4, b.ncpu, 1)
    e = I.measured_exponent(b, at4)
    assert e == pytest.approx(math.log(0.8) / math.log(p4 / p16))
    # the machine ran 10 % slower at the 4-client run: that share of its CPU is not the client count's
    assert I.measured_exponent(b, at4, drift=1.1) == pytest.approx(math.log(0.8 / 1.1) / math.log(p4 / p16))
    assert I.measured_exponent(b, replace(at4, regime="latency-bound")) is None
    assert I.measured_exponent(b, replace(at4, hops=["pgbouncer"])) is None                 # another path
    assert I.measured_exponent(b, replace(at4, hops=[])) is None
    assert I.measured_exponent(b, replace(at4, clients=14)) is None                          # too close to tell
    assert I.measured_exponent(b, replace(at4, cpu={"backend.sys": 100 * sum(b.cpu.values())})) is None  # insane
    assert I.measured_exponent(b, replace(at4, foreign_cpus=0.1)) is None        # another load beside one run
    assert I.measured_exponent(replace(b, foreign_cpus=0.3), at4) is None


def test_the_exponent_is_the_median_of_the_same_shape_of_path_and_its_uncertainty_shrinks_with_pairs():
    m = taught((0.10, "direct"), (0.05, "direct"), (0.20, "direct"), (-0.2, "pgbouncer"))
    e, spread, src = I.exponent(m, [])
    assert e == pytest.approx(0.10) and "3 pair(s)" in src and "direct paths" in src
    assert "the last pair 2 " in src                              # the last of its shape, not pgbouncer's pair 3
    assert spread == pytest.approx((2 ** (1.4826 * 0.05 / math.sqrt(3)) - 1) * 100)
    e, spread, src = I.exponent(m, ["pgbouncer"])              # one pair: a single pair's spread
    assert e == pytest.approx(-0.2) and spread == pytest.approx((2 ** I.PAIR_SD - 1) * 100) and "pgbouncer" in src
    assert I.exponent(m, ["docker-proxy"]) == (None, 0.0, "")    # never measured: another shape's pairs say nothing
    assert I.exponent({}, []) == (None, 0.0, "")


def test_a_learned_exponent_prices_another_client_count_and_keeps_the_anchor():
    b = base("docker-dnat")
    m = replace(b, machine={**b.machine, **taught((0.1, "docker-proxy"), (0.12, "docker-proxy"), (0.08, "docker-proxy"),
                                                     (0.3, "direct"))})
    at4, note = I.at_clients(m, 4)
    f = (I.processes_per_cpu(4, b.ncpu, 1) / I.processes_per_cpu(16, b.ncpu, 1)) ** 0.1
    assert sum(at4.cpu.values()) == pytest.approx(f * sum(b.cpu.values())) and f < 1
    assert note and f"x{f:.2f}" in note and "docker-proxy paths" in note
    assert at4.band_pct > b.band_pct and at4.band_parts["interleave_pct"] > 0
    assert I.at_clients(m, 16)[0] is m                            # the run's own count: its anchor untouched
    assert I.at_clients(m, 1)[0] is m                             # fewer clients than CPUs: idle, not interleaved
    for machine in ({}, taught((0.1, "docker-proxy"), (0.12, "docker-proxy"), (0.3, "direct"))):
        # nothing learned, or fewer than MIN_PAIRS pairs of this shape: the run's demand, and how to teach it
        same, note = I.at_clients(replace(b, machine=machine), 4)
        assert same.cpu == b.cpu and "sweep --clients 4,16 --repeat 3" in note
    with_e, without = P.predict(m, [4, 16]), P.predict(b, [4, 16])
    assert with_e[0]["tps"] > without[0]["tps"] and any("interleaves" in a for a in with_e[0]["assumptions"])
    assert with_e[1]["tps"] == pytest.approx(without[1]["tps"], rel=1e-9)


def test_learn_from_pair_keeps_a_client_count_pair_under_its_paths_shape(tmp_path, monkeypatch):
    rd = RunDir.open(RUNS / "docker-dnat")
    s = summarize(rd)
    b = P.base_of(rd, s)
    at4 = replace(b, clients=4, cpu={k: v * 0.8 for k, v in b.cpu.items()})
    bases = iter([b, at4])
    monkeypatch.setattr(P, "base_of", lambda *a, **k: next(bases))
    path = tmp_path / "machine-costs.json"
    e = mc.learn_from_pair(rd, s, rd, s, path=path)
    assert e == pytest.approx(I.measured_exponent(b, at4))
    (sample,) = mc.current(path)[I.KEY]["samples"]
    assert sample["hop"] == "docker-proxy" and sample["run"] == f"{rd.path} -> {rd.path}"
    assert H.KEY not in mc.current(path)                         # not a hop's removal
