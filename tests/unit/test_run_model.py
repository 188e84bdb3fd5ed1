"""The typed run model (analysis.run_model): every recorded run directory loads through it, one test per schema
version of run.json (1.0 as recorded, 1.0 as a killed run leaves it, 1.1 as `pathprof merge` writes it), the
documents it reads stay the dicts that are written, and its fields cover what the shipped JSON Schemas name."""
import json
import typing
from dataclasses import fields
from pathlib import Path

import pytest
from pathprof.analysis import run_model as M
from pathprof.analysis.rundir import SCHEMA, RunDir
from pathprof.analysis.schemas import load as load_schema
from pathprof.analysis.summary import summarize

RUNS = sorted(p for p in (Path(__file__).parent / "data" / "runs").iterdir() if (p / "run.json").exists())


def _names(cls) -> set[str]:
    return {f.name for f in fields(cls)}


@pytest.mark.parametrize("run", RUNS, ids=[p.name for p in RUNS])
def test_schema_1_0_recorded_runs_load(run):
    rd = RunDir.open(run)
    meta = json.loads((run / "run.json").read_text())
    r = rd.run
    assert r.schema == "pathprof-run/1.0" and r.doc == meta
    assert r.topology.name == meta["topology"]["name"] and r.workload.clients == meta["workload"]["clients"]
    assert r.load_result.tps == meta["pgbench"]["result"]["tps"] and r.driver == "pgbench"
    assert r.probes.level == meta["probes"]["level"] and r.host.cpus == meta["host"]["cpus"]
    s = rd.summary()
    doc = summarize(rd)
    assert s.doc == doc                       # the document printed is the one summarize writes
    assert s.closure.latency_error_pct == doc["closure"]["latency_error_pct"]
    assert [(x.name, x.leg, x.us_per_txn) for x in s.stages] == [(x["name"], x["leg"], x["us_per_txn"])
                                                                 for x in doc["stages"]]
    assert [c.component for c in s.cpu] == [c["component"] for c in doc["cpu"]]
    assert s.latency_ms.mean == doc["latency_ms"]["mean"] and s.tps == doc["tps"]


def test_schema_1_0_a_killed_run_loads_with_empty_sections(tmp_path):
    """A run killed before its results: only the required keys; every section reads as empty, not a KeyError."""
    d = tmp_path / "killed"
    d.mkdir()
    (d / "run.json").write_text(json.dumps({"schema": "pathprof-run/1.0", "run_id": "killed", "created": "x",
                                            "pathprof_version": "0.0", "status": "killed", "extra": {"k": 1}}))
    rd = RunDir.open(d)
    r = rd.run
    assert (r.status, r.load_result, r.workload.clients, r.probes.level, r.probes.schedule) == \
        ("killed", None, None, "off", None)
    assert r.services == [] and r.postgres.checkpoints.during_run is None and r.doc["extra"] == {"k": 1}
    s = rd.summary()
    assert s.tps is None and s.stages == [] and s.closure.latency_error_pct is None and s.windows is None
    assert s.probes == "off" and s.driver == "pgbench"


def test_schema_1_1_merged_run_loads(tmp_path):
    """1.1 (`pathprof merge`): + scope, hosts, clock_offsets; the load was observed, not driven."""
    from test_merge import merge, two_runs
    c, s, _ = two_runs(tmp_path)
    rd = RunDir.open(merge([c, s], tmp_path / "m", tmp_path).path)
    r = rd.run
    assert r.schema == SCHEMA and r.driver == "observed" and r.load_result is r.observed
    assert [h["name"] for h in r.hosts] == ["cli", "srv"] and len(r.clock_offsets) == 1
    summary = rd.summary()
    assert summary.driver == "observed" and [h["name"] for h in summary.hosts] == ["cli", "srv"]
    assert summary.closure.cycle_us and summary.stages


def test_a_summary_is_read_not_copied():
    doc = {"topology": "t", "closure": None, "stages": [{"name": "a", "leg": "request", "us_per_txn": 1.0},
                                                        "not a row"], "windows": {}}
    s = M.Summary.of(doc)
    assert s.doc is doc and M.Summary.of(s) is s
    assert s.closure.cycle_us is None and s.windows is None and [x.name for x in s.stages] == ["a"]
    assert s.stages[0].doc is doc["stages"][0]


def _schema_keys(schema: dict) -> set[str]:
    return set((schema.get("properties") or {}).keys())


def test_the_model_names_every_key_the_schemas_ship():
    """A key added to a shipped schema must be added to the model too (or readers fall back to string keys)."""
    run, summary = load_schema("run"), load_schema("summary")
    assert _schema_keys(run) <= _names(M.RunMeta)
    assert _schema_keys(summary) <= _names(M.Summary)
    hints = typing.get_type_hints(M.RunMeta)
    for key, prop in run["properties"].items():
        section = hints[key]
        model = next((a for a in (section, *typing.get_args(section)) if hasattr(a, "__dataclass_fields__")), None)
        if model is not None:
            assert _schema_keys(prop) <= _names(model), key
    closure = summary["properties"]["closure"]
    assert _schema_keys(closure) <= _names(M.Closure)
    assert _schema_keys(summary["properties"]["stages"]["items"]) <= _names(M.Stage)
    assert _schema_keys(summary["properties"]["cpu"]["items"]) <= _names(M.CpuComponent)
