"""OTLP export (pathprof.analysis.export.otlp, otlp_ids, otlp_send): trace ids two hosts derive alike, the spans
of a transaction, the request body written for later and sent to a real OTLP/HTTP receiver on 127.0.0.1
(tests/otlp_receiver.py, the protocol's own protobuf decoder)."""
from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from otlp_receiver import GrpcReceiver, Receiver, flatten, need_grpc, parse_json
from pathprof.analysis.export import otlp, otlp_ids, otlp_send
from pathprof.analysis.rundir import RunDir
from pathprof.errors import UserError

# The client host dials a published port; the server host DNATs it to the container's address; the client
# host's MASQUERADE gives the wire its source: neither socket's own tuple is the wire's.
CLI_SOCK, PUBLISHED = ("10.99.0.2", 40000), ("198.18.21.2", 15432)
WIRE_CLI, WIRE_SRV = "198.18.21.1:40000", "198.18.21.2:15432"
SRV_SOCK = ("172.31.0.2", 5432)
WALL = 1_700_000_000_000_000_000 - 5_000_000_000       # wall minus monotonic in the fake windows


def _msg(ts, d, role, leg, txn, local, remote, seq):
    return {"ts_ns": ts, "dir": d, "role": role, "leg": leg, "txn": txn, "pid": 1, "tid": 1, "local_ip": local[0],
            "local_port": local[1], "remote_ip": remote[0], "remote_port": remote[1], "tcp_seq": seq}


def _span(ts, dur, role, stage, leg, txn, pid=10):
    return {"ts_ns": ts, "dur_ns": dur, "pid": pid, "tid": pid, "role": role, "stage": stage, "txn": txn, "leg": leg}


def client_host(seqs=(1000, 1060), t0=5_000_000_000):
    """The client's agent: per transaction pgbench's request send (a marker) and its chain of spans
    (request wire, the response's delivery, pgbench's own time): a complete transaction."""
    spans, msgs = [], []
    for k, seq in enumerate(seqs):
        t, txn = t0 + k * 100_000, 40 + k
        spans += [_span(t, 30_000, "backend", "wire.backend", "request", txn),
                  _span(t + 30_000, 8_000, "backend", "backend.execute", "server", txn, pid=20),
                  _span(t + 38_000, 5_000, "pgbench", "wire.pgbench", "response", txn, pid=20),
                  _span(t + 43_000, 2_000, "pgbench", "recv.pgbench", "response", txn),
                  _span(t + 45_000, 1_500, "pgbench", "client.pgbench", "client", txn)]
        msgs.append(_msg(t, "send", "pgbench", "request", txn, CLI_SOCK, PUBLISHED, seq))
    meta = {"run_id": "cli-run", "pathprof_version": "0.1.0", "topology": {"name": "attach"},
            "host": {"hostname": "vm"},
            "probes": {"windows": [{"start_mono_ns": 1, "start_realtime_ns": 1 + WALL}]},
            "scope": {"host": "pp-cli", "leaving_connections": [
                {"side": "client", "local": "%s:%d" % CLI_SOCK, "remote": "%s:%d" % PUBLISHED,
                 "wire_local": WIRE_CLI, "wire_remote": WIRE_SRV}]}}
    return pd.DataFrame(spans), pd.DataFrame(msgs), meta


def server_host(seqs=(1000, 1060), t0=9_000_000_000):
    """The server's agent, its own clock and its own transaction numbers: the request's delivery (a marker)
    starts its part: wakeup, runqueue, execute."""
    spans, msgs = [], []
    for k, seq in enumerate(seqs):
        t, txn = t0 + k * 100_000, 7 + k
        spans += [_span(t, 2_000, "backend", "wakeup.backend", "request", txn, pid=20),
                  _span(t + 2_000, 4_000, "backend", "runqueue.backend", "request", txn, pid=20),
                  _span(t + 6_000, 8_000, "backend", "backend.execute", "server", txn, pid=20)]
        msgs.append(_msg(t, "recv", "backend", "request", txn, SRV_SOCK, ("198.18.21.1", 40000), seq))
    meta = {"run_id": "srv-run", "pathprof_version": "0.1.0", "host": {"hostname": "vm"},
            "scope": {"host": "pp-srv", "leaving_connections": [
                {"side": "server", "local": "%s:%d" % SRV_SOCK, "remote": "198.18.21.1:40000",
                 "wire_local": WIRE_SRV, "wire_remote": WIRE_CLI}]}}
    return pd.DataFrame(spans), pd.DataFrame(msgs), meta


def test_two_hosts_views_of_one_transaction_get_one_trace_id():
    cli = otlp.build(*client_host())
    srv = otlp.build(*server_host())
    assert (cli.traces, cli.wire_ids, cli.complete) == (2, 2, 2)
    assert (srv.traces, srv.wire_ids, srv.complete) == (2, 2, 0)
    roots = {s.context.trace_id: s for s in cli.spans if s.parent is None}
    hosts = {s.context.trace_id: s for s in srv.spans if s.name == "host pp-srv"}
    assert set(roots) == set(hosts) and len(roots) == 2
    for tid, root in roots.items():
        assert root.name == "transaction" and root.attributes["pathprof.connection"] == f"{WIRE_CLI}>{WIRE_SRV}"
        assert hosts[tid].parent.span_id == root.context.span_id       # the server's part hangs under the root
    assert set(roots) == {otlp_ids.trace_id(f"{WIRE_CLI}>{WIRE_SRV}", s) for s in (1000, 1060)}


def test_a_client_agent_whose_chain_starts_at_the_response_joins_by_its_request():
    """On the client's own host the request's wire is the server host's: its chain is the response's delivery
    and pgbench's time; the response marker leads to the request marker of the same socket and number."""
    traces, msgs, meta = client_host()
    traces = traces[traces["stage"].isin(["wire.pgbench", "recv.pgbench", "client.pgbench"])].copy()
    resp = traces[traces["stage"] == "wire.pgbench"]
    sock = {"local_ip": CLI_SOCK[0], "local_port": CLI_SOCK[1], "remote_ip": PUBLISHED[0], "remote_port": PUBLISHED[1]}
    rec = pd.DataFrame([{**_msg(int(r.ts_ns), "recv", "pgbench", "response", int(r.txn), CLI_SOCK, PUBLISHED,
                                555 + i), **sock} for i, r in enumerate(resp.itertuples())])
    built = otlp.build(traces, pd.concat([msgs, rec], ignore_index=True), meta)
    roots = {s.context.trace_id: s for s in built.spans if s.parent is None}
    srv = {s.context.trace_id for s in otlp.build(*server_host()).spans}
    assert built.wire_ids == 2 and set(roots) <= srv
    sends = sorted(int(t) + WALL for t in msgs["ts_ns"])
    assert sorted(r.start_time for r in roots.values()) == sends        # the root opens at the request's send


def test_different_transactions_and_connections_differ():
    conn = f"{WIRE_CLI}>{WIRE_SRV}"
    other = f"198.18.21.1:40001>{WIRE_SRV}"
    ids = {otlp_ids.trace_id(conn, 1000), otlp_ids.trace_id(conn, 1060), otlp_ids.trace_id(other, 1000),
           otlp_ids.trace_id(f"{WIRE_SRV}>{WIRE_CLI}", 1000)}
    assert len(ids) == 4 and all(0 < i < 2**128 for i in ids)
    assert otlp_ids.trace_id(conn, 1000 + 2**32) == otlp_ids.trace_id(conn, 1000)    # a 32-bit number on the wire


def test_a_server_host_without_nat_reverses_its_socket_tuple():
    assert otlp_ids.client_conn("recv", "198.18.1.2:5432", "198.18.1.1:5000", {}) == "198.18.1.1:5000>198.18.1.2:5432"
    assert otlp_ids.client_conn("send", "198.18.1.1:5000", "198.18.1.2:5432", {}) == "198.18.1.1:5000>198.18.1.2:5432"


def test_spans_of_a_transaction_match_the_stages():
    traces, msgs, meta = client_host()
    built = otlp.build(traces, msgs, meta, {"chain": [{"process": "pgbench", "host": "client"},
                                                      {"process": "postgres", "host": "server"}]})
    assert len(built.spans) == len(traces) + 2 and built.left_out == 0
    by_trace: dict[int, list] = {}
    for s in built.spans:
        by_trace.setdefault(s.context.trace_id, []).append(s)
    for spans in by_trace.values():
        root = [s for s in spans if s.parent is None]
        kids = [s for s in spans if s.parent is not None]
        assert len(root) == 1 and len(kids) == 5
        assert all(k.parent.span_id == root[0].context.span_id for k in kids)
        assert [k.name for k in kids] == ["wire.backend", "backend.execute", "wire.pgbench", "recv.pgbench",
                                          "client.pgbench"]
        assert [k.end_time - k.start_time for k in kids] == [30_000, 8_000, 5_000, 2_000, 1_500]
        assert root[0].start_time == kids[0].start_time and root[0].end_time == kids[-1].end_time
        assert len({k.context.span_id for k in spans}) == 6
        txn = kids[0].attributes["pathprof.txn"]
        assert root[0].start_time == 5_000_000_000 + (txn - 40) * 100_000 + WALL        # on the wall clock
        assert kids[0].attributes["pathprof.host"] == "server" and kids[3].attributes["pathprof.host"] == "client"
        assert kids[1].attributes["process.pid"] == 20 and kids[1].attributes["pathprof.leg"] == "server"
        assert root[0].resource.attributes["host.name"] == "pp-cli"
        assert root[0].resource.attributes["service.name"] == "pathprof"
        assert root[0].resource.attributes["service.version"] == "0.1.0"


def test_without_markers_each_transaction_gets_its_own_local_id():
    traces, _, meta = client_host()
    built = otlp.build(traces, None, meta)
    roots = [s for s in built.spans if s.parent is None]
    assert built.wire_ids == 0 and len({r.context.trace_id for r in roots}) == 2
    assert {r.attributes["pathprof.trace_id.source"] for r in roots} == {"local"}


def test_a_run_without_sampled_traces_is_refused_in_one_line():
    with pytest.raises(UserError, match="no sampled traces.*--trace-sample"):
        otlp.build(None, None, {"run_id": "r"})
    lone = pd.DataFrame([_span(1, 10, "backend", "wire.backend", "request", 1),
                         _span(500, 10, "pgbench", "wire.pgbench", "response", 1)])
    with pytest.raises(UserError, match="forms a transaction"):
        otlp.build(lone, None, {"run_id": "r"})


def test_request_body_files_decode_as_otlp(tmp_path):
    built = otlp.build(*client_host())
    n = otlp_send.write(built.spans, tmp_path / "t.pb")
    pb = flatten(ExportTraceServiceRequest.FromString((tmp_path / "t.pb").read_bytes()))
    assert n == (tmp_path / "t.pb").stat().st_size and len(pb) == len(built.spans)
    otlp_send.write(built.spans, tmp_path / "t.json")
    js = flatten(parse_json((tmp_path / "t.json").read_bytes()))
    assert js == pb
    assert pb[0]["trace_id"] == f"{built.spans[0].context.trace_id:032x}"
    text = (tmp_path / "t.json").read_text()
    assert pb[0]["trace_id"] in text                              # OTLP/JSON ids are hex, not base64


def test_send_to_a_receiver_and_errors():
    built = otlp.build(*client_host())
    with Receiver() as r:
        assert otlp_send.send(built.spans, r.url) == 1
        got = r.spans()
        assert r.content_types == ["application/x-protobuf"]
    assert sorted(s["span_id"] for s in got) == sorted(f"{s.context.span_id:016x}" for s in built.spans)
    with pytest.raises(UserError, match=r"^OTLP endpoint http://127\.0\.0\.1:\d+/v1/traces is unreachable"):
        otlp_send.send(built.spans, r.url)                     # closed now
    with Receiver(status=400) as r, pytest.raises(UserError, match="did not take the spans.*400"):
        otlp_send.send(built.spans, r.url)
    with pytest.raises(UserError, match="expected an OTLP/HTTP URL"):
        otlp_send.traces_url("127.0.0.1:4318")
    assert otlp_send.traces_url("http://h:4318") == "http://h:4318/v1/traces"
    assert otlp_send.traces_url("http://h:4318/custom/traces") == "http://h:4318/custom/traces"


def test_send_over_grpc_to_a_receiver_and_errors():
    need_grpc()
    import grpc
    built = otlp.build(*client_host())
    with GrpcReceiver() as r:
        assert otlp_send.send(built.spans, r.url, protocol="grpc") == 1
        got = r.spans()
    assert sorted(s["span_id"] for s in got) == sorted(f"{s.context.span_id:016x}" for s in built.spans)
    assert {s["resource"]["host.name"] for s in got} == {"pp-cli"}
    with pytest.raises(UserError, match=r"^OTLP endpoint http://127\.0\.0\.1:\d+ is unreachable"):
        otlp_send.send(built.spans, r.url, protocol="grpc")            # closed now
    with GrpcReceiver(code=grpc.StatusCode.INVALID_ARGUMENT) as r, \
            pytest.raises(UserError, match="did not take the spans.*INVALID_ARGUMENT"):
        otlp_send.send(built.spans, r.url, protocol="grpc")
    with pytest.raises(UserError, match="expected an OTLP/gRPC address"):
        otlp_send.grpc_target("127.0.0.1:4317/v1/traces")
    assert otlp_send.grpc_target("http://h:4317") == ("h:4317", True)
    assert otlp_send.grpc_target("https://h:4317") == ("h:4317", False)


def test_cli_exports_a_run_directory(tmp_path):
    traces, msgs, meta = client_host()
    rd = RunDir.create(tmp_path, "attach")
    rd.update(**{k: v for k, v in meta.items() if k != "run_id"})
    rd.write_frame("traces.parquet", traces)
    rd.write_frame("messages.parquet", msgs)
    out = tmp_path / "body.pb"
    cmd = [sys.executable, "-m", "pathprof.agent.cli.main", "export", str(rd.path), "--format", "otlp"]
    p = subprocess.run([*cmd, "-o", str(out)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == str(out) and "2 traces (2 complete transactions), 12 spans" in p.stderr
    with Receiver() as r:
        p = subprocess.run([*cmd, "--endpoint", r.url], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        assert len(r.spans()) == 12
    p = subprocess.run([*cmd, "--endpoint", r.url], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "unreachable" in p.stderr
    need_grpc()
    with GrpcReceiver() as g:
        p = subprocess.run([*cmd, "--endpoint", g.url, "--protocol", "grpc"], capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 0, p.stderr
        assert len(g.spans()) == 12 and f"over OTLP/gRPC to {g.url}" in p.stderr
    p = subprocess.run([*cmd, "--protocol", "grpc", "-o", str(out)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "--protocol is for sending" in p.stderr
