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
    assert I.measured_exponent(b, replace(at4, regime="latency-bound", hop_awake={})) is None   # nothing held it
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


HELD = Path(__file__).parent / "data" / "predict-rounds" / "2026-11-28-2238"     # bench/predict all, 3 rounds


def held_pairs():
    """Each round's pgbouncer base at 16 clients and the same path at 4 (plan.tsv: base, 1 client, direct, 4)."""
    for line in (HELD / "plan.tsv").read_text().splitlines():
        b16, _, _, b4 = line.split("\t")
        yield tuple(P.base_of(RunDir.open(HELD / "runs" / n)) for n in (b16, b4))


def hold(b):
    return b.hop_awake["pgbouncer"] * 1e6 / b.measured_tps


def test_a_pair_held_back_by_a_poolers_thread_teaches_how_its_hold_grows():
    """pgbouncer at 16 and at 4 clients on 2 CPUs: neither run saturated the CPUs, the pooler's one thread found
    most of its messages waiting; the demand that limited both is the thread's hold per transaction (its awake
    share / TPS: its CPU and its wait for one), so the pair's exponent is that hold's, kept under its own shape."""
    for b16, b4 in held_pairs():
        # neither run's own processes saturated the CPUs; the 4-client one is modelled as CPU-bound all the same,
        # its path's work filling the model's CPUs (test_predict_regime), which changes nothing of the pair's shape
        assert max(b.own_cpus / b.ncpu for b in (b16, b4)) < P.SATURATED, [b.own_cpus for b in (b16, b4)]
        assert b16.regime == "latency-bound" and b16.hop_us and (b16.clients, b4.clients) == (16, 4)
        p16, p4 = I.processes_per_cpu(16, b16.ncpu, 1), I.processes_per_cpu(4, b4.ncpu, 1)
        e = I.measured_exponent(b16, b4)
        assert e == pytest.approx(math.log(hold(b4) / hold(b16)) / math.log(p4 / p16))
        assert I.pair_shape(b16, b4) == "pgbouncer held:pgbouncer" and I.held_by(b16) == "pgbouncer"
        assert I.measured_exponent(b16, b4, drift=1.1) == pytest.approx(
            math.log(hold(b4) / 1.1 / hold(b16)) / math.log(p4 / p16))
        # not held: the CPUs idle in one run, or the thread mostly asleep between messages
        assert I.measured_exponent(replace(b16, own_cpus=0.5 * b16.ncpu), b4) is None
        assert I.measured_exponent(b16, replace(b4, hop_awake={"pgbouncer": 0.5})) is None
        assert I.pair_shape(b16, replace(b4, hop_awake={"pgbouncer": 0.5})) == "pgbouncer"


def test_a_held_base_is_priced_at_another_client_count_by_held_pairs_only():
    (b16, b4), *_ = held_pairs()
    cpu_pairs = taught((-0.2, "pgbouncer"), (-0.2, "pgbouncer"), (-0.2, "pgbouncer"))
    same, note = I.at_clients(replace(b16, machine={**b16.machine, **cpu_pairs}), 4)
    assert same.hop_us == b16.hop_us and "0 pair(s) of pgbouncer runs held back by pgbouncer's thread" in note
    held = taught(*[(0.15, "pgbouncer held:pgbouncer")] * 3)
    at4, note = I.at_clients(replace(b16, machine={**b16.machine, **held}), 4)
    f = (I.processes_per_cpu(4, b16.ncpu, 1) / I.processes_per_cpu(16, b16.ncpu, 1)) ** 0.15
    assert at4.hop_us["pgbouncer"] == pytest.approx(f * b16.hop_us["pgbouncer"]) and "held back by" in note
    assert P.predict(replace(b16, machine={**b16.machine, **held}), [4])[0]["tps"] > P.predict(b16, [4])[0]["tps"]
    # a base that saturated the CPUs is priced by the CPUs' pairs, whatever its hop's thread did
    assert I.held_by(replace(b16, regime="cpu-bound")) is None
