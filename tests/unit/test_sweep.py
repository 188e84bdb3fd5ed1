from fixtures_summaries import summary, sweep_runs
from pathprof.analysis.sweep import sweep_analysis, sweep_text


def test_knee_and_growth():
    runs = sweep_runs()
    a = sweep_analysis(list(reversed(runs)))          # order of input does not matter
    assert [p["clients"] for p in a["points"]] == [1, 4, 16, 48]
    assert a["knee_clients"] == 4                     # 4 → 16 gained only ~3 % per doubling
    assert "4 to 16" in a["knee_reason"]
    assert a["points"][3]["gain_per_doubling_pct"] < 0
    assert a["growing_stage"] == "runqueue.backend"
    assert a["growing_component"] == "backend"
    assert a["stage_growth"][0]["delta_us_per_txn"] == 790.0
    text = sweep_text(a)
    assert "after 4 clients" in text and "runqueue.backend" in text and "2 CPUs" in text


def test_knee_on_drop_and_no_knee():
    runs = [summary("x", clients=c, tps=t) for c, t in ((1, 100.0), (2, 190.0), (4, 150.0))]
    a = sweep_analysis(runs)
    assert a["knee_clients"] == 2 and "dropped" in a["knee_reason"]
    grow = sweep_analysis([summary("x", clients=c, tps=t) for c, t in ((1, 100.0), (2, 190.0), (4, 370.0))])
    assert grow["knee_clients"] is None
    assert "still grows at 4 clients" in sweep_text(grow)
    assert grow["growing_stage"] is None              # identical stages at every point


def test_single_point():
    a = sweep_analysis([summary("x")])
    assert a["knee_clients"] is None and a["stage_growth"] == []
    assert "at least two" in sweep_text(a)
