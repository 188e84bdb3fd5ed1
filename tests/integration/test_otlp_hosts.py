"""OTLP from two agents: a client host and a server host (namespaces, DNAT on the server's side,
tests/integration/two_hosts.py), one `attach --netns --trace-sample 4` each, both runs exported to one OTLP
receiver without merging: the server's spans join the client's traces (same trace id, parented on the
client's root span). Both agents sample the same 1 in 4 transactions (by their TCP sequence numbers): before,
each picked by its own transaction count and only --trace-sample 1 joined more than a quarter."""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import PATHPROF
from otlp_receiver import GrpcReceiver, Receiver, need_grpc

sys.path.insert(0, os.path.dirname(__file__))
from test_merge_hosts import _attach, _done  # noqa: E402
from two_hosts import pgbench, two_hosts, wait_connected  # noqa: E402

SAMPLE = 4                 # 1 in 4 transactions, on both hosts
START_IN_S = 8.0           # both agents' probes loaded before it, beside the other lane too (test_three_hosts)

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(os.geteuid() != 0, reason="builds namespaces and loads BPF: root only")]


def test_two_agents_traces_join_in_the_receiver(tmp_path):
    runs = tmp_path / "runs"
    with two_hosts() as h:
        load = pgbench(2, 30, h["tmp"], rate=2000)   # thousands of traces are plenty: exporting 50k took 40 s
        try:
            wait_connected(2)
            # one interval for both (--start-at): started one after the other, each began when its own probes were
            # ready, and beside the other lane the two 2-s intervals once overlapped for a third of the
            # transactions (341 joined of 983, fresh-clone CI 2026-11-27)
            at = ["--start-at", f"{time.time() + START_IN_S:.3f}"]
            srv = _attach(["--netns", h["server_ns"], "--port", str(h["pg_port"]), *at], runs, sample=SAMPLE,
                          seconds=2)
            cli = _attach(["--netns", h["client_ns"], "--remote", h["remote"], *at], runs, sample=SAMPLE, seconds=2)
            s, c = _done(srv), _done(cli)
        finally:
            load.terminate()
            load.wait(timeout=30)
    with Receiver() as r:
        for run in (c["run_dir"], s["run_dir"]):
            p = subprocess.run([*PATHPROF, "export", run, "--format", "otlp", "--endpoint", r.url],
                               capture_output=True, text=True, timeout=300)
            assert p.returncode == 0, p.stderr[-3000:]
        spans = r.spans()
    need_grpc()
    with GrpcReceiver() as g:                   # the same runs over OTLP/gRPC: the same spans arrive
        for run in (c["run_dir"], s["run_dir"]):
            p = subprocess.run([*PATHPROF, "export", run, "--format", "otlp", "--endpoint", g.url, "--protocol",
                                "grpc"], capture_output=True, text=True, timeout=300)
            assert p.returncode == 0, p.stderr[-3000:]
        assert sorted((x["trace_id"], x["span_id"], x["parent"]) for x in g.spans()) == sorted(
            (x["trace_id"], x["span_id"], x["parent"]) for x in spans)
    by_host: dict[str, list] = {}
    for sp in spans:
        by_host.setdefault(sp["resource"]["host.name"], []).append(sp)
    assert set(by_host) == {h["client_ns"], h["server_ns"]}
    cli_roots = {sp["trace_id"]: sp for sp in by_host[h["client_ns"]] if not sp["parent"]}
    srv_tops = {sp["trace_id"]: sp for sp in by_host[h["server_ns"]] if sp["name"] == f"host {h['server_ns']}"}
    wire = sum(sp["attrs"]["pathprof.trace_id.source"] == "wire" for sp in srv_tops.values())
    assert wire >= 0.99 * len(srv_tops)
    # the client's wire tuple as the server's agent derives it through its DNAT: the published address
    assert {sp["attrs"]["pathprof.connection"].split(">")[1] for sp in srv_tops.values()
            if "pathprof.connection" in sp["attrs"]} == {h["remote"]}
    joined = set(cli_roots) & set(srv_tops)
    # both agents overlap for most of their 3 s and pick the same transactions: nearly all of the fewer join
    # (with each agent's own choice, 1 in SAMPLE would)
    print(f"sampled 1 in {SAMPLE}: client {len(cli_roots)} traces, server {len(srv_tops)}, joined {len(joined)}")
    assert len(joined) >= 0.8 * min(len(cli_roots), len(srv_tops)) and len(joined) > 100, \
        (len(cli_roots), len(srv_tops), len(joined))
    for tid in joined:
        root, top = cli_roots[tid], srv_tops[tid]
        assert top["parent"] == root["span_id"]
        # one kernel, one clock: the server's part lies inside the client's transaction (±50 µs of wall-clock
        # conversion, each agent's own)
        assert root["start"] - 50_000 <= top["start"] <= top["end"] <= root["end"] + 50_000
    assert Path(c["run_dir"]).exists() and Path(s["run_dir"]).exists()
