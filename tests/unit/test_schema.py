"""run.json and the run/report document against the JSON Schemas shipped in analysis/schemas: every recorded
fixture and every summary built from one must validate, and documents that break the contract must not."""
import copy
import json
from pathlib import Path

import jsonschema
import pytest
from pathprof.analysis.rundir import RunDir
from pathprof.analysis.schemas import load
from pathprof.analysis.summary import summarize

DATA = Path(__file__).parent / "data"
# runs/: schema 1.0 recordings; recent/: later ones (1.3: steal_ns)
RUNS = sorted(p for d in ("runs", "recent") for p in (DATA / d).iterdir() if (p / "run.json").exists())


@pytest.fixture(scope="module")
def schemas():
    return {name: jsonschema.Draft202012Validator(load(name)) for name in ("run", "summary")}


def test_schemas_are_valid_json_schemas():
    for name in ("run", "summary"):
        jsonschema.Draft202012Validator.check_schema(load(name))


@pytest.mark.parametrize("run", RUNS, ids=[p.name for p in RUNS])
def test_recorded_runs_validate(run, schemas):
    meta = json.loads((run / "run.json").read_text())
    schemas["run"].validate(meta)
    schemas["summary"].validate(json.loads(json.dumps(summarize(RunDir.open(run)), default=str)))


def test_broken_documents_are_refused(schemas):
    meta = json.loads((RUNS[0] / "run.json").read_text())
    for breakage in (lambda m: m.update(schema="pathprof-run/2.0"), lambda m: m.update(status="half-done"),
                     lambda m: m["workload"].update(clients=0), lambda m: m.pop("run_id"),
                     lambda m: m["probes"].update(level="everything")):
        bad = copy.deepcopy(meta)
        breakage(bad)
        assert not schemas["run"].is_valid(bad)
    doc = json.loads(json.dumps(summarize(RunDir.open(RUNS[0])), default=str))
    for breakage in (lambda d: d.pop("closure"), lambda d: d["stages"][0].pop("us_per_txn"),
                     lambda d: d.update(regime="fast"), lambda d: d.update(tps=-1.0)):
        bad = copy.deepcopy(doc)
        breakage(bad)
        assert not schemas["summary"].is_valid(bad)


def test_headline_tps_is_the_unprobed_one():
    """#19: the run's TPS is the rate outside the probe windows; the in-window and whole-run rates are named."""
    from pathprof.analysis.summary import headline_tps
    windowed = {"level": "basic", "windows": [{}], "schedule": {"always_on": False},
                "in_windows": {"tps": 80.0, "txns": 160}, "outside_windows": {"tps": 100.0, "txns": 200}}
    h = headline_tps(90.0, windowed)
    assert (h["tps"], h["tps_in_windows"], h["tps_whole_run"]) == (100.0, 80.0, 90.0) and "outside" in h["tps_basis"]
    always = {"level": "basic", "windows": [{}], "schedule": {"always_on": True}, "in_windows": {"tps": 80.0}}
    h = headline_tps(80.0, always)
    assert h["tps"] == 80.0 and "always" in h["tps_basis"]
    assert headline_tps(50.0, {"level": "off"})["tps_basis"].startswith("whole run, no probes")
    # 26 transactions in 14 ms outside (a window's programs slow to attach): no reference rate, the whole run's
    sliver = {**windowed, "outside_windows": {"tps": 1839.96, "txns": 26, "duration_s": 0.0141}}
    h = headline_tps(52162.2, sliver)
    assert h["tps"] == 52162.2 and "no reference rate" in h["tps_basis"], h
