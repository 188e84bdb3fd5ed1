"""Client connections that carry no traffic, for real: an application's pool keeps connections open and idle,
and a client paced by its own work (pgbench -R) sits between its transactions. attach counted every client
connection as a client busy the whole interval (the cycle clients / TPS): two idle connections beside two busy
clients made the latency view close at -50 %. The cycle is now the connections' own time, from each one's first
request in the interval to its last (probes/msg.bpf.h client_cycle), so an idle connection is no one's time and a
paced client's pauses are its own stage. Ground truth: the hand-built pgbouncer path of foreign_path.py, two idle
psycopg connections held open through the pooler beside pgbench's two clients paced at 200 transactions a second
in all."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))
from conftest import ROOT, run_pathprof  # noqa: E402
from foreign_path import foreign_path, pgbench, wait_connected  # noqa: E402
from truth import record  # noqa: E402

pytestmark = pytest.mark.integration

# two connections through the pooler, one query each, then idle until killed (bounded: 60 s)
IDLE = textwrap.dedent("""
    import sys, time
    import psycopg
    conns = [psycopg.connect(f"host=127.0.0.1 port={sys.argv[1]} user=postgres dbname=postgres", autocommit=True)
             for _ in range(2)]
    for c in conns:
        c.execute("select 1").fetchone()
    print("idle", flush=True)
    time.sleep(60)
""")


@pytest.fixture(scope="module")
def attached(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("idle")
    tmp.chmod(0o777)
    (tmp / "idle.py").write_text(IDLE)
    with foreign_path() as fp:
        idle = subprocess.Popen([str(ROOT / ".venv/bin/python"), str(tmp / "idle.py"), str(fp["port"])],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
        load = pgbench(fp["port"], 2, 60, str(tmp), rate=200)
        try:
            assert idle.stdout.readline().strip() == "idle", idle.communicate(timeout=30)[1][-2000:]
            wait_connected(fp["port"], 4)
            time.sleep(1)
            cp = run_pathprof("attach", "--port", str(fp["port"]), "--duration", "3", "--json", "--no-live",
                              runs_dir=tmp / "runs")
            assert load.poll() is None and idle.poll() is None    # both outlived the attach
        finally:
            for p in (load, idle):
                p.kill()
                p.communicate(timeout=30)
    assert cp.returncode == 0, cp.stderr[-3000:]
    doc = json.loads(cp.stdout)
    return doc, json.loads((Path(doc["run_dir"]) / "run.json").read_text())


def test_idle_connections_are_seen_but_are_no_clients_time(attached):
    doc, run = attached
    assert doc["clients"] == 4, doc["clients"]                          # every connection to the pooler
    assert run["observed"]["active_connections"] == 2, run["observed"]  # pgbench's two, not the idle ones
    assert any("2 of the 4 client connections sent no request" in n for n in doc["notes"]), doc["notes"]
    # the cycle is the two clients' own time: about 2 / TPS, not 4 / TPS
    cycle, naive = doc["closure"]["cycle_us"], 4 * 1e6 / doc["tps"]
    assert 0.4 * naive < cycle < 0.6 * naive, (cycle, naive)


def test_the_view_closes_with_idle_and_paced_clients(attached):
    doc, _ = attached
    err = doc["closure"]["latency_error_pct"]
    record("closure with idle and paced clients", err, "|x| <= 5")
    assert abs(err) <= 5, doc["closure"]
    # the paced clients' pauses are theirs: the client's own stage holds most of the cycle (-R 200 for two: ~10 ms)
    client = sum(s["us_per_txn"] for s in doc["stages"] if s["leg"] == "client")
    assert client > 0.5 * doc["closure"]["cycle_us"], (client, doc["closure"])
