"""A lone client's path work against a loaded run's (analysis.lone_client), on real figures: three rounds of the nic
path at 16 clients and at one (tests/unit/data/predict-lone, from stop 51's `PP_BENCH_ROUNDS=4 bench/predict all`).
A client alone on the nic path paid 1.2-1.5x the work on the path its 16-client run's CPU view put there (no
softirq batching, no message found waiting), and every one-client prediction from the 16-client run was over:
+19 ... +35 %. Each round is predicted with the factor the *other* two rounds' pairs taught, as a user's `sweep
--clients 1,16` teaches it (agent.host.machine_costs.learn_from_pair). Frozen runs: a regression test of the model
on real figures, not a timing claim."""
import json
import statistics
from pathlib import Path

import pytest
from pathprof.agent.host import machine_costs as mc
from pathprof.analysis import lone_client
from pathprof.analysis import predict as P
from pathprof.analysis.rundir import RunDir

DATA = Path(__file__).parent / "data" / "predict-lone" / "2026-11-29-0800-nic"
WITHIN = 0.15


def rounds():
    lines = (DATA / "plan.tsv").read_text().split("\n")
    return [tuple(RunDir.open(DATA / "runs" / n) for n in line.split("\t")) for line in lines if line.strip()]


def predicted(rd_base, machine) -> float:
    b = P.base_of(rd_base, rd_base.summary(), machine=machine)
    (row,) = P.predict(b, [1])
    return row["tps"]


def test_each_pair_teaches_a_direct_paths_lone_client_factor(tmp_path):
    for base, one in rounds():
        costs = tmp_path / f"{base.path.name}.json"
        costs.write_text("{}")
        # either order (a sweep from 1 to 16 clients, or a compare from the loaded run): the same factor
        f = mc.learn_from_pair(base, base.summary(), one, one.summary(), path=costs)
        back = tmp_path / f"{base.path.name}-back.json"
        back.write_text("{}")
        assert mc.learn_from_pair(one, one.summary(), base, base.summary(), path=back) == pytest.approx(f, rel=1e-6)
        (sample,) = json.loads(costs.read_text())[lone_client.KEY]["samples"]
        assert sample["hop"] == "direct" and 1.1 < sample["value"] < lone_client.SANE[1], sample


def test_one_client_from_a_loaded_nic_run_with_the_other_rounds_factor(tmp_path):
    """Judged as bench/predict judges: the medians over the rounds (one round is the machine's weather: the round
    over by 34.6 % had its own pair's factor at 1.50 against 1.23-1.28 in the others); and every round closer."""
    rs = rounds()
    without, with_, measured = [], [], []
    for i, (base, one) in enumerate(rs):
        costs = tmp_path / f"costs-{i}.json"
        costs.write_text("{}")
        for j, (b2, o2) in enumerate(rs):
            if j != i:
                mc.learn_from_pair(b2, b2.summary(), o2, o2.summary(), path=costs)
        taught = json.loads(costs.read_text())
        assert len(taught[lone_client.KEY]["samples"]) == len(rs) - 1 >= lone_client.MIN_PAIRS
        without.append(predicted(base, {}))
        with_.append(predicted(base, taught))
        measured.append(P.measured_tps(one.summary()))
        assert abs(with_[-1] / measured[-1] - 1) < abs(without[-1] / measured[-1] - 1), (i, without, with_, measured)
    err = {k: statistics.median(v) / statistics.median(measured) - 1 for k, v in (("without", without),
                                                                                  ("with", with_))}
    assert err["without"] > WITHIN, f"the premise: the median was over by more than 15 % without ({err})"
    assert abs(err["with"]) <= WITHIN, err


def test_a_factor_needs_its_pairs_and_a_loaded_base(tmp_path):
    base, one = rounds()[0]
    b = P.base_of(base, base.summary())
    costs = tmp_path / "one-pair.json"
    costs.write_text("{}")
    mc.learn_from_pair(base, base.summary(), one, one.summary(), path=costs)
    once = {**b.machine, **json.loads(costs.read_text())}
    assert lone_client.at_clients(P.replace(b, machine=once), 1)[1] is None          # one pair is not enough
    entry = json.loads(costs.read_text())[lone_client.KEY]
    twice = {**b.machine, lone_client.KEY: {**entry, "samples": entry["samples"] * lone_client.MIN_PAIRS}}
    scaled, note = lone_client.at_clients(P.replace(b, machine=twice), 1)
    assert note and sum(scaled.cpu.values()) > sum(b.cpu.values())
    assert lone_client.at_clients(P.replace(b, machine=twice), 4)[1] is None          # not past the CPUs' count
    lone = P.base_of(one, one.summary(), machine=twice)                              # nor from a lone run itself
    assert lone_client.at_clients(lone, 1)[1] is None
