"""pathprof predict on real runs: a loopback sweep of 1 and 16 clients carries the first run's prediction of the
16-client TPS next to the measurement; then `predict` itself on the recorded 1-client run.

Whether the prediction falls within its stated band is a benchmark (bench/predict), not asserted here: on this
shared 2-core machine it did in 2 of 4 real runs (issue #18's closing note has the figures), and a test that fails
half the time proves nothing either way."""
import json

import pytest
from conftest import machine_state, run_pathprof

pytestmark = pytest.mark.integration


def test_sweep_predicts_16_clients_from_1_within_its_band(runs_dir):
    before = machine_state()
    cp = run_pathprof("sweep", "--topology", "loopback", "--clients", "1,16", "--duration", "3", "--json",
                      runs_dir=runs_dir, check=True, timeout=600)
    doc = json.loads(cp.stdout)
    first, second = doc["sweep"]["points"]
    assert "predicted_from_first" not in first
    pred = second["predicted_from_first"]
    assert pred["clients"] == 16 and pred["scenario"] == "as recorded"
    # the measurement it is checked against: the 16-client run's TPS without probes attached
    measured = doc["runs"][1]["windows"]["tps_out"]
    assert pred["measured_tps"] == pytest.approx(measured)
    assert pred["tps_low"] < pred["tps"] < pred["tps_high"], pred
    assert pred["within_band"] == (pred["tps_low"] <= measured <= pred["tps_high"]), pred
    # 16 clients on 2 CPUs: the CPUs limit, and the model says so
    assert pred["limited_by"] == "cpu", pred
    assert machine_state() == before

    # the same model through `predict` on the recorded 1-client run, with the text its --help promises
    one = doc["runs"][0]["run_dir"]
    cp = run_pathprof("predict", one, "--clients", "1,16", "--json", check=True)
    rows = json.loads(cp.stdout)["scenarios"]
    assert [r["clients"] for r in rows] == [1, 16]
    assert rows[1]["tps"] == pytest.approx(pred["tps"], rel=1e-6)
    measured_one = doc["runs"][0]["windows"]["tps_out"]
    if any(a.startswith("foreign load:") for a in rows[0]["assumptions"]):
        # other processes kept the CPUs from idling during the run; predicted for the path alone, wakeups onto
        # idle CPUs come back, so never faster than measured
        assert rows[0]["tps"] <= measured_one * 1.02
    else:
        assert rows[0]["tps"] == pytest.approx(measured_one, rel=0.02)                # anchored on the run
    bad = run_pathprof("predict", one, "--link", "wire:rtt_us=100")
    assert bad.returncode == 2 and "no link or interface 'wire'" in bad.stderr and "Traceback" not in bad.stderr
