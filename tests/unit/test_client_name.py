"""The client's stages go by its program's name (#35.4): a run directory whose run.json names the client
(`workload.client`, what `attach` records) reports `client.python3`, `runqueue.python3`, `python3.user` in its
report, JSON and OpenMetrics labels; one that does not (pathprof drove pgbench, or recorded before) keeps pgbench."""
import json
import shutil
from pathlib import Path

import pytest
from pathprof.analysis.client import name_of
from pathprof.analysis.explain import explain
from pathprof.analysis.export.openmetrics import render, stage_histograms
from pathprof.analysis.gap import _links
from pathprof.analysis.report import path_model
from pathprof.analysis.run_model import Summary
from pathprof.analysis.rundir import RunDir
from pathprof.analysis.summary import summarize

RUNS = Path(__file__).parent / "data" / "runs"


def test_names_from_comms():
    assert name_of(["sysbench", "sysbench"]) == "sysbench"
    assert name_of(["python3.11"]) == "python3-11"           # a dot would split the stage name
    assert name_of(["python3", "psql"]) == "psql+python3"
    assert name_of([]) == "pgbench"                           # nothing found: the default, as before
    assert name_of(["backend"]) == "client-backend"           # never mistaken for the server's own stages


def _as_client(tmp_path, name: str | None) -> RunDir:
    """The recorded pgbouncer run (2 clients, traces) as if attach had found a client called `name`."""
    dst = tmp_path / "run"
    shutil.copytree(RUNS / "pgbouncer-traces", dst)
    meta = json.loads((dst / "run.json").read_text())
    if name:
        meta["workload"]["client"] = name
    (dst / "run.json").write_text(json.dumps(meta))
    return RunDir.open(dst)


def _names(doc: dict) -> list[str]:
    return [s["name"] for s in doc["stages"]] + [c["component"] for c in doc["cpu"]]


def test_a_named_client_names_every_stage_and_component(tmp_path):
    rd = _as_client(tmp_path, "python3")
    doc = summarize(rd)
    names = _names(doc)
    assert not [n for n in names if "pgbench" in n], names
    for expected in ("client.python3", "runqueue.python3", "wire.python3", "python3.user", "python3.sys"):
        assert expected in names, (expected, names)
    assert doc["workload"]["client"] == "python3"
    # the same figures as the unnamed run: only the names differ
    plain = summarize(RunDir.open(RUNS / "pgbouncer-traces"))
    assert sorted(s["us_per_txn"] for s in doc["stages"]) == sorted(s["us_per_txn"] for s in plain["stages"])
    assert plain["workload"]["client"] == "pgbench" and "client.pgbench" in _names(plain)
    # OpenMetrics labels, histograms included
    text = render([doc], {"run": stage_histograms(rd.read_frame("stages.parquet"), "python3")})
    samples = [line for line in text.splitlines() if not line.startswith("#")]
    assert any('stage="client.python3"' in line and "_bucket" in line for line in samples)
    assert not [line for line in samples if "pgbench" in line]
    # the chain check, the path diagram and the explanation find the client by its name
    links = _links(Summary.of(doc).stages, "python3")
    assert any(who == "python3" and "processing" in d for (_, who), d in links.items()), links
    model = path_model.build(doc, rd.read_json("topology.json"))
    client = model["processes"][0]
    assert client["id"] == "python3" and client["own_us"] > 0 and client["cpu_us"] > 0, client
    slower = json.loads(json.dumps(doc))
    for s in slower["stages"]:
        if s["name"] == "client.python3":
            s["us_per_txn"] += 50.0
    slower["tps"] = doc["tps"] * 0.5
    e = explain(doc, slower)
    assert e["causes"][0]["name"] == "client" and e["causes"][0]["process"] == "python3", e["causes"]


@pytest.mark.parametrize("name", [None, "pgbench"])
def test_runs_pathprof_drove_keep_pgbench(tmp_path, name):
    doc = summarize(_as_client(tmp_path, name))
    assert "client.pgbench" in _names(doc) and "pgbench.user" in _names(doc)
