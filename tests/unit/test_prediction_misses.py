"""The band from the machine's checked predictions (analysis.prediction_misses): the conformal rank, what is kept,
which checks a prediction's band comes from, and a check learned from a real pair (three rounds of the nic path at
16 clients and at one, tests/unit/data/predict-lone) -- each round's band taught by the other rounds' checks."""
import json
from pathlib import Path

import pytest
from pathprof.agent.host import machine_costs as mc
from pathprof.analysis import predict as P
from pathprof.analysis import prediction_misses as PM
from pathprof.analysis.rundir import RunDir

DATA = Path(__file__).parent / "data" / "predict-lone" / "2026-11-29-0800-nic"


def rounds():
    lines = (DATA / "plan.tsv").read_text().split("\n")
    return [tuple(RunDir.open(DATA / "runs" / n) for n in line.split("\t")) for line in lines if line.strip()]


def checks(values, question="fewer clients", hops=()) -> dict:
    """A machine's prediction_miss_pct entry holding these misses."""
    entry = None
    for v in values:
        entry = PM.remembered(entry, v, question, list(hops), "p", "t")
    return entry


def base_with(entry):
    """The first nic round's 16-client run as the model's base, on a machine that checked `entry`."""
    base, _ = rounds()[0]
    return P.base_of(base, base.summary(), machine={PM.KEY: entry})


def test_the_conformal_half_width_covers_nine_in_ten_and_the_largest_while_few():
    assert PM.conformal_half([-2.0, 5.0, 1.0]) == 5.0                 # rank ceil(4 * 0.9) = 4 > 3: the largest
    misses = [float(x) for x in range(1, 21)]                         # 1 ... 20 %
    assert PM.conformal_half(misses) == 19.0                          # rank ceil(21 * 0.9) = 19
    assert PM.conformal_half([-30.0] + misses[:9]) == 30.0            # signs do not matter, n = 10: the largest


def test_questions_and_what_is_kept():
    assert [PM.question(16, 1), PM.question(1, 16), PM.question(16, 16), PM.question(16, 16, ("pgbouncer",))] == [
        "fewer clients", "more clients", None, "without a hop"]
    entry = None
    for i in range(PM.RECENT + 5):
        entry = PM.remembered(entry, i, "fewer clients", [], f"pair {i}", "t")
    entry = PM.remembered(entry, 50.0, "without a hop", ["pgbouncer"], "other", "t")
    fewer = [x for x in entry["samples"] if x["question"] == "fewer clients"]
    assert len(fewer) == PM.RECENT and fewer[0]["value"] == 5 and fewer[-1]["value"] == PM.RECENT + 4
    assert [x["hop"] for x in entry["samples"] if x["question"] == "without a hop"] == ["pgbouncer"]


def test_a_band_comes_from_checks_of_the_same_question_and_shape_only():
    entry = checks((-4.0, 2.5))
    machine = {PM.KEY: entry}
    assert PM.band(machine, "fewer clients")[0] is None                       # two checks: too few
    entry = PM.remembered(entry, 12.0, "fewer clients", ["pgbouncer"], "p", "t")   # another shape
    entry = PM.remembered(entry, 30.0, "more clients", [], "p", "t")             # another question
    assert PM.band({PM.KEY: entry}, "fewer clients")[0] is None
    entry = PM.remembered(entry, 1.0, "fewer clients", [], "p", "t")
    half, n, text = PM.band({PM.KEY: entry}, "fewer clients")
    assert (half, n) == (4.0, 3) and "fewer clients on direct paths" in text and "1.0-4.0 %" in text
    tiny = {PM.KEY: checks((0.1, -0.2, 0.0), "more clients")}
    assert PM.band(tiny, "more clients")[0] == PM.FLOOR_PCT      # never a band of nothing


def test_a_prediction_takes_the_checked_band_for_its_question_only():
    b = base_with(checks((3.0, -6.0, 1.5)))
    assert b.band_pct > 6.5, "the run's own band is wider than the checks: else this test shows nothing"
    one, same = P.predict(b, [1, b.clients])
    assert one["band_pct"] == 6.0 and one["tps_low"] == pytest.approx(one["tps"] * 0.94, rel=1e-3)
    assert one["question"] == "fewer clients" and "3 checked predictions" in one["band_from"]
    assert same["band_pct"] == b.band_pct and same["band_from"].startswith("the run's own")
    (linked,) = P.predict(b, [1], P.Scenario(link_us={"wire": 100.0}))       # another change: the run's own band
    assert linked["band_pct"] == b.band_pct and linked["question"] is None


def test_a_compare_of_a_real_pair_teaches_its_miss_and_the_next_band_covers_the_rounds(tmp_path):
    """Each round's one-client prediction from its 16-client run, with the band the other rounds' checks give: the
    bench's leave-one-out. The band must be what those checks missed by."""
    misses = []
    for base, one in rounds():
        row = P.predict_for(base.summary(), one.summary())
        assert row["question"] == "fewer clients"
        costs = tmp_path / f"{base.path.name}.json"
        costs.write_text("{}")
        assert mc.learn_from_check(base, base.summary(), one, one.summary(), row, path=costs) == row["error_pct"]
        (sample,) = json.loads(costs.read_text())[PM.KEY]["samples"]
        assert (sample["question"], sample["hop"], sample["value"]) == ("fewer clients", "direct", row["error_pct"])
        # a row that asks none of the questions (the run itself, another change) is not remembered
        assert mc.learn_from_check(base, base.summary(), one, one.summary(), {**row, "question": None},
                                   path=costs) is None
        misses.append(row["error_pct"])
    (row,) = P.predict(base_with(checks(misses)), [1])     # three: enough for a band
    assert row["band_pct"] == round(max(abs(x) for x in misses), 1)


def test_the_table_says_where_a_checked_band_comes_from():
    from pathprof.agent.cli.predict_cmd import render
    b = base_with(checks((3.0, -6.0, 1.5)))
    rows = P.predict(b, [1, b.clients])
    text = render({"topology": "nic", "run_clients": b.clients, "measured_tps": b.measured_tps,
                   "band_pct": b.band_pct, "band_parts": b.band_parts, "scenarios": rows})
    assert f"{rows[0]['tps_low']:,.0f}..{rows[0]['tps_high']:,.0f}" in text
    assert "band from this machine's last 3 checked predictions of fewer clients on direct paths" in text
