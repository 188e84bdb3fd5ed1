"""`run --dsn --netns` (#21.4): pgbench driven from inside a namespace standing for the client's machine, the
server on another "host" (tests/integration/two_hosts.py: namespaces joined by a veth wire, DNAT on the server's
side) recorded by its own `attach --netns`, and the two joined by `pathprof merge`: the client side of a
pgbench-driven run is a host like any other.

Both agents are given one --start-at: the server's attach (started on an idle connection: it joins pgbench's
connections opened after its start) begins its interval then, the client's run starts pgbench then, each with its
probes loaded, and the server's interval is a second longer, so it covers the client's. The two hosts must record
the same interval: with the server's
agent attached for only the middle 3 s of the client's 6 s, the merged closure was +0.8 ... +4.5 % (9 runs), a
bias, not noise: on this one CPU-bound kernel the path behaves differently while the second agent's probes run
(pgbench's response waits, queued/runqueue/wakeup, 8.4 µs per transaction inside the server's interval, 11.1
outside), and the client's tables averaged both periods while the server's had only one."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from test_merge_hosts import PP, _attach, _done  # noqa: E402
from two_hosts import PG_BIN, PUBLISHED, SRV_IP, two_hosts, wait_connected  # noqa: E402

CLOSURE_PCT = 5.0
OUTSIDE_PCT = 5.0          # each host's sampled messages outside the interval both recorded
START_IN_S = 5.0           # both agents load their probes meanwhile (~1-2 s each on this 2-core machine)


def _idle_client(ns: str) -> subprocess.Popen:
    """A psql session that stays connected and idle (its script is stdin, left open): the server's agent has a
    client to start from before pgbench connects."""
    return subprocess.Popen(["ip", "netns", "exec", ns, f"{PG_BIN}/psql", "-h", SRV_IP, "-p", str(PUBLISHED), "-U",
                             "postgres", "-q", "postgres"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="builds namespaces and loads BPF: root only")


def test_run_dsn_from_a_namespace_merges_with_the_servers_agent(tmp_path):
    runs = tmp_path / "runs"
    with two_hosts() as h:
        idle = _idle_client(h["client_ns"])
        try:
            wait_connected(1)
            at = ["--start-at", f"{time.time() + START_IN_S:.3f}"]
            srv = _attach(["--netns", h["server_ns"], "--port", str(h["pg_port"]), *at], runs, seconds=5)
            dsn = f"host={SRV_IP} port={PUBLISHED} user=postgres dbname=postgres"
            cli = subprocess.Popen([*PP, "run", "--dsn", dsn, "--netns", h["client_ns"], "-c", "2", "-T", "4", *at,
                                    "--trace-sample", "2", "--probe-duty", "100", "--json", "--no-live",
                                    "--runs-dir", str(runs)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True)
            try:
                c, s = _done(cli), _done(srv)
            finally:
                if cli.poll() is None:
                    cli.kill()
        finally:
            idle.stdin.close()
            idle.wait(timeout=30)
    # both began at the time given: neither agent's probes were ready late (else the premise below is off)
    assert not [n for n in c["notes"] + s["notes"] if "--start-at" in n], (c["notes"], s["notes"])
    meta = json.loads((Path(c["run_dir"]) / "run.json").read_text())
    scope = meta["scope"]
    assert scope["host"] == h["client_ns"] and scope["netns"] == h["client_ns"]
    # pgbench's two connections leave the client's "machine" for the published address it dialled
    assert len(scope["leaving_connections"]) == 2, scope
    assert all(x["side"] == "client" and x["remote"] == h["remote"] for x in scope["leaving_connections"])
    assert meta["pgbench"]["result"]["transactions"] > 1000
    assert {x["name"] for x in c["stages"]} >= {"client.pgbench"}
    assert not any("backend" in x["name"] for x in c["stages"])      # the server is another host's

    merged = tmp_path / "merged"
    cp = subprocess.run([*PP, "merge", c["run_dir"], s["run_dir"], "-o", str(merged), "--json"],
                        capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stderr
    d = json.loads(cp.stdout)
    (o,) = d["clock_offsets"]
    assert (o["host_a"], o["host_b"]) == (h["client_ns"], h["server_ns"])
    assert abs(o["offset_us"]) <= o["bound_us"] < 1000, o
    names = {(x["name"], x["leg"]) for x in d["stages"]}
    assert {("wire.backend", "request"), ("wire.pgbench", "response"), ("backend.execute", "server"),
            ("client.pgbench", "client")} <= names, sorted(names)
    outside = {x["name"]: x["outside_common_pct"] for x in json.loads((merged / "run.json").read_text())["hosts"]}
    print("run --dsn --netns merged:", d["closure"], o, "outside the common interval (%):", outside)
    assert all(v <= OUTSIDE_PCT for v in outside.values()), outside       # the premise: one interval
    assert abs(d["closure"]["latency_error_pct"]) <= CLOSURE_PCT, d["closure"]

