import json

import pandas as pd
import pytest
from fixtures_summaries import dnat
from pathprof.analysis.export.files import (
    stages_to_csv,
    stages_to_parquet,
    to_perfetto,
    validate_trace_events,
    write_perfetto,
)
from pathprof.errors import UserError


def traces():
    rows = []
    for txn in range(3):
        t = 1_000_000_000 + txn * 500_000
        rows += [(t, 6_000, 100, 100, "pgbench", "send.pgbench", txn),
                 (t + 6_000, 90_000, 300, 301, "hop.docker-proxy", "hop.docker-proxy", txn),
                 (t + 96_000, 12_000, 200, 200, "backend", "backend.execute", txn),
                 (t + 108_000, 5_000, 100, 100, "pgbench", "recv.pgbench", txn)]
    return pd.DataFrame(rows, columns=["ts_ns", "dur_ns", "pid", "tid", "role", "stage", "txn"])


def test_perfetto_document_is_valid_and_has_one_track_per_process():
    doc = to_perfetto(traces(), {"topology": {"name": "docker-dnat"}, "run_id": "r1"})
    assert validate_trace_events(doc) == []
    json.dumps(doc, allow_nan=False)
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == 12
    first = spans[0]
    assert first["ts"] == 0.0 and first["dur"] == 6.0 and first["name"] == "send.pgbench"
    assert first["args"] == {"role": "pgbench", "txn": 0}
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert names == {100: "pgbench (pid 100)", 300: "hop.docker-proxy (pid 300)", 200: "backend (pid 200)"}
    sort = {e["pid"]: e["args"]["sort_index"] for e in doc["traceEvents"] if e["name"] == "process_sort_index"}
    assert sort[100] < sort[300] < sort[200]           # client, hop, server: the path reads top to bottom
    assert doc["otherData"]["topology"] == "docker-dnat"


def test_missing_columns_are_handled():
    df = traces().drop(columns=["pid", "tid", "dur_ns", "txn"])
    doc = to_perfetto(df, {})
    assert validate_trace_events(doc) == []
    pids = {e["pid"] for e in doc["traceEvents"] if e["ph"] == "X"}
    assert len(pids) == 3                              # one synthetic track per role
    assert to_perfetto(traces().drop(columns=["role", "stage"]), {})["traceEvents"][-1]["name"] == "span"
    assert validate_trace_events(to_perfetto(pd.DataFrame(), {})) == []
    with pytest.raises(UserError):
        to_perfetto(traces().drop(columns=["ts_ns"]), {})


def test_validator_rejects_malformed_documents():
    assert validate_trace_events({"events": []}) == ["traceEvents missing or not a list"]
    assert validate_trace_events("nope")
    bad = {"traceEvents": [
        {"name": "a", "ph": "X", "ts": 1.0, "pid": 1, "tid": 1},                 # no dur
        {"name": "b", "ph": "Q", "ts": 1.0, "pid": 1, "tid": 1},                 # unknown phase
        {"name": "c", "ph": "X", "ts": "1", "dur": 1, "pid": 1, "tid": 1},       # ts is a string
        {"name": "d", "ph": "X", "ts": 1.0, "dur": -2, "pid": 1.5, "tid": 1},    # negative dur, float pid
        {"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {}},     # no args.name
        {"name": "e", "ph": "X", "ts": float("nan"), "dur": 1, "pid": 1, "tid": 1},
    ]}
    errors = validate_trace_events(bad)
    joined = "\n".join(errors)
    for text in ("event 0: complete event needs", "event 1: ph 'Q'", "event 2: ts", "event 3: dur is negative",
                 "event 3: pid must be an integer", "event 4: process_name needs args.name", "event 5: ts",
                 "not strict JSON"):
        assert text in joined, text


def test_write_perfetto(tmp_path):
    p = write_perfetto(traces(), {}, tmp_path / "t.json")
    assert validate_trace_events(json.loads(p.read_text())) == []


def test_stage_tables(tmp_path):
    csv = stages_to_csv(dnat(), tmp_path / "s.csv")
    back = pd.read_csv(csv)
    assert list(back.columns) == ["name", "leg", "us_per_txn", "p99_us"]
    assert "hop.docker-proxy" in set(back["name"])
    frame = pd.DataFrame({"stage": ["a", "b"], "role": ["x", "y"], "hist": [[1, 2, 3], [0, 4]]})
    back = pd.read_csv(stages_to_csv(frame, tmp_path / "h.csv"))
    assert json.loads(back["hist"][0]) == [1, 2, 3]
    pq = stages_to_parquet(frame, tmp_path / "s.parquet")
    assert pd.read_parquet(pq)["stage"].tolist() == ["a", "b"]
