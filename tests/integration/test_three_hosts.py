"""Three machines (#21): client -> pooler -> server, each its own host. pathprof builds the pgbouncer-3host path
(its own pp-pb3-* namespaces on one switch, 198.18.12.0/24) and drives pgbench through it with its probes off;
one `pathprof attach --netns` per "host" records that host's part: the client's by `--remote` (its server is
the pooler's machine), the pooler's by `--port 6432` (pgbouncer, whose server is on a third machine: the last
hop on its host), the database's by `--port 5432`. `pathprof merge` joins the three runs: two links, each with
its clock offset ± bound, a wire stage per direction on each, and the merged path closing against the client's
cycle. On one kernel the true offsets are 0."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from pathprof.agent.run.attach import INTERVAL_OVER  # noqa: E402
from premise import note_remake  # noqa: E402
from test_merge_hosts import PP, _attach  # noqa: E402
from truth import record  # noqa: E402

CLI, POOL, DB = "pp-pb3-cli", "pp-pb3-pool", "pp-pb3-db"
POOLER, SERVER = "198.18.12.2:6432", "198.18.12.3:5432"
CLOSURE_PCT = 5.0          # the bound, latency and CPU, against the client's cycle and the machine's CPU
CLIENTS = 8
# The agents begin together (--start-at) once all three have loaded their probes: started together without it,
# each began when its own probes were ready, 2 ... 13 % of a 4 s interval apart (sampled messages outside the
# common interval), and the merged latency closure once reached +5.6 % (bench/hosts, 2 clients); with it 0.0 ...
# 7.7 % in 6 runs (each agent's windows open and close in ~0.1-0.2 s on this loaded machine), closure -0.5 ... +0.2 %
# three agents loading their probes at once took up to ~4 s here before their verification got faster (50 ms a
# probe); alone, now, 3.5-4.4 s. Beside another full load (a 16-client run) they needed 7.4-9.0 s: alone.
# On a fresh machine (cold page cache, first loads of the object) the three were ready 0.4 / 1.3 / 1.2 s after a
# moment 5 s ahead (fresh-clone CI, 2026-11-27): 10 s, and a late start fails saying so (below)
START_IN_S = 10.0
# ... and once more, ready 0.93 s late with 10 s given (fresh-clone round ci48c-1, the suite's first minutes): an
# agent that says it began late is made again, the load going on (tests/premise.py counts it). Twice: the first
# try was late in 11 of 40 fresh-clone rounds (stops 51-55: 0.37-2.49 s, cold caches of a fresh clone), the second
# never; at one remake two late tries in a row would fail the round, and a third try costs ~15 s when it is needed
LATE_REMAKES = 2
# Was 15: 11.8 % once in a full suite and 18.9 % beside the other lane, each agent's window opening 0.1-0.45 s
# late while it attached its programs after the moment. They are attached before it now (prepare_window) and the
# window opens at it: 0.1-0.4 % alone, 5.4 % once beside the other lane (2026-11-26)
OUTSIDE_PCT = 10.0
# 4 s: at 3 s the same lateness (~0.45 s of the pooler's agent) was 15.2 % once in CI (2026-11-25)
INTERVAL_S = 4
LOAD_EXTRA: list[str] = []   # more `pathprof run` flags for the load (bench/hosts: --rate)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="builds namespaces and loads BPF: root only")


def _wait_clients(n: int, timeout: float = 90.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        out = subprocess.run(["ip", "netns", "exec", CLI, "ss", "-Htn", "state", "established", "( dport = :6432 )"],
                             capture_output=True, text=True).stdout
        if len(out.splitlines()) >= n:
            return
        time.sleep(0.3)
    raise AssertionError(f"pgbench did not connect {n} clients to the pooler")


class Agent:
    """An attach agent whose stderr is read as it comes: the moment it says its interval is over."""

    def __init__(self, proc: subprocess.Popen):
        self.proc, self.err, self.over = proc, [], threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.err.append(line)
            if INTERVAL_OVER in line:
                self.over.set()
        self.over.set()                          # it exited: nothing more to wait for

    def result(self) -> dict:
        out = self.proc.stdout.read()
        self.proc.wait(timeout=60)
        self.reader.join(10)
        assert self.proc.returncode == 0, "".join(self.err)[-2000:]
        return json.loads(out)


def _three_agents(runs: Path) -> tuple[dict, dict, dict]:
    """The built path with pgbench running and no probes of its own; the three agents' reports."""
    load = subprocess.Popen([*PP, "run", "-t", "pgbouncer-3host", "--probes", "off", "-c", str(CLIENTS), "-j", "2",
                             "-T", "60", *LOAD_EXTRA, "--no-live", "--runs-dir", str(runs / "built")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stopped = False
    try:
        _wait_clients(CLIENTS)
        time.sleep(0.5)
        results = None
        for attempt in range(1 + LATE_REMAKES):
            start = time.time() + START_IN_S
            at = ["--start-at", f"{start:.3f}"]      # one interval for the three
            agents = [Agent(_attach(["--netns", CLI, "--remote", POOLER, *at], runs, seconds=INTERVAL_S)),
                      Agent(_attach(["--netns", POOL, "--port", "6432", *at], runs, seconds=INTERVAL_S)),
                      Agent(_attach(["--netns", DB, "--port", "5432", *at], runs, seconds=INTERVAL_S))]
            for a in agents:
                assert a.over.wait(START_IN_S + INTERVAL_S + 60), "".join(a.err)[-2000:]
            if attempt == LATE_REMAKES:
                break                            # the last try is judged whatever it says: read below
            # the premise, three intervals that begin together, holds only if every agent was ready at the moment:
            # a late one is made again while the load goes on (its probes load from a warm cache the second time)
            results = [a.result() for a in agents]
            late = [n for r in results for n in r["notes"] if "--start-at" in n]
            if not late:
                break
            note_remake("late_start", f"an agent began late ({late[0][:90]})", results[0]["run_dir"])
            results = None
        # the load is needed for the intervals only: stopped once all three say theirs is over (not at a fixed
        # time: beside the other lane all three once began ~0.6 s late, CI run 40); the last try's agents read their
        # results on CPUs pgbench no longer saturates
        load.send_signal(signal.SIGINT)          # the run stops early and tears its path down
        stopped = True
        return tuple(results or [a.result() for a in agents])
    finally:
        if not stopped:                          # once: a second SIGINT would cut its teardown short
            load.send_signal(signal.SIGINT)
        _, err = load.communicate(timeout=120)
        assert load.returncode in (0, 130), err[-2000:]


def test_three_hosts_merge_through_the_pooler(tmp_path):
    runs = tmp_path / "runs"
    c, p, s = _three_agents(runs)
    # the pooler's host: pgbouncer is the path's last hop there, its server named as another machine's
    assert any("connects onward to " + SERVER in n for n in p["notes"]), p["notes"]
    assert {x["name"] for x in p["stages"]} >= {"hop.pgbouncer"}
    assert not any("backend" in x["name"] or "pgbench" in x["name"] for x in p["stages"])
    scope = json.loads((Path(p["run_dir"]) / "run.json").read_text())["scope"]
    sides = sorted((x["side"], x["remote"].rsplit(":", 1)[0]) for x in scope["leaving_connections"])
    assert sides == [("client", "198.18.12.3")] * CLIENTS + [("server", "198.18.12.1")] * CLIENTS, sides

    merged = tmp_path / "merged"
    cp = subprocess.run([*PP, "merge", c["run_dir"], s["run_dir"], p["run_dir"], "-o", str(merged), "--json"],
                        capture_output=True, text=True, timeout=180)
    assert cp.returncode == 0, cp.stderr
    d = json.loads(cp.stdout)
    # connections matched across both boundaries, in the chain's order whatever the order given
    meta = json.loads((merged / "run.json").read_text())
    assert [(lk["client_host"], lk["server_host"], len(lk["connections"])) for lk in meta["links"]] == [
        (CLI, POOL, CLIENTS), (POOL, DB, CLIENTS)], meta["links"]
    assert [(o["host_a"], o["host_b"]) for o in d["clock_offsets"]] == [(CLI, POOL), (POOL, DB)]
    for o in d["clock_offsets"]:
        print(f"offset {o['host_a']} -> {o['host_b']}: {o['offset_us']:+.3f} ± {o['bound_us']:.3f} µs "
              f"({o['samples_ab']} / {o['samples_ba']} trips)")
        assert abs(o["offset_us"]) <= o["bound_us"] < 1000, o          # one kernel: the true offset is 0
        assert o["samples_ab"] > 100 and o["samples_ba"] > 100, o
    # every trip of every direction on both links: never negative once corrected
    wire = pd.read_parquet(merged / "wire.parquet")
    per_dir = wire.groupby(["client_host", "dir"])["wire_ns"].agg(["count", "min", "mean"])
    print(per_dir)
    assert len(per_dir) == 4 and (per_dir["count"] > 100).all() and (per_dir["min"] >= 0).all(), per_dir
    names = {(x["name"], x["leg"]): x["us_per_txn"] for x in d["stages"]}
    for stage in (("wire.pgbouncer", "request"), ("wire.backend", "request"), ("wire.pgbouncer", "response"),
                  ("wire.pgbench", "response"), ("hop.pgbouncer", "request"), ("hop.pgbouncer", "response"),
                  ("backend.execute", "server"), ("client.pgbench", "client")):
        assert names.get(stage, 0) > 0, (stage, sorted(names))
    late = [n for n in c["notes"] + p["notes"] + s["notes"] if "--start-at" in n]
    print("began late:", late)
    outside = {x["name"]: x["outside_common_pct"] for x in d["hosts"]}
    record("max outside common interval %", max(outside.values()), f"<= {OUTSIDE_PCT}")
    record("merged closure.latency", d["closure"]["latency_error_pct"], f"|x| <= {CLOSURE_PCT}")
    print("3-host merged:", d["closure"], "outside the common interval (%):", outside)
    assert all(v <= OUTSIDE_PCT for v in outside.values()), (outside, "agents ready after --start-at:", late)

    assert d["closure"]["latency_basis"] == "cycle"
    assert abs(d["closure"]["latency_error_pct"]) <= CLOSURE_PCT, d["closure"]
    assert abs(d["closure"]["cpu_error_pct"]) <= CLOSURE_PCT, d["closure"]
    cpu = {x["component"]: x.get("host") for x in d["cpu"]}
    assert {cpu.get(k) for k in cpu if k.startswith("hop.pgbouncer")} == {POOL}, cpu
