"""A client that is not pgbench, for real (#35.4): a small psycopg application (two connections, one thread each,
`select 1` in a loop) through the hand-built pgbouncer path of foreign_path.py, profiled by `pathprof attach`.
Its stages, CPU components, OTLP spans and OpenMetrics labels must go by its program's name (the comm the kernel
gives it, `python3`), and none may be called pgbench: pathprof did not drive pgbench here."""
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
from foreign_path import foreign_path, wait_connected  # noqa: E402
from otlp_receiver import flatten, parse_json  # noqa: E402

pytestmark = pytest.mark.integration

# pathprof's own interpreter: it has psycopg; started as `python3`, so the kernel's comm for it is python3
PYTHON3 = str(ROOT / ".venv" / "bin" / "python3")
APP = textwrap.dedent("""
    import sys, threading, time
    import psycopg
    port, seconds = int(sys.argv[1]), float(sys.argv[2])
    def loop():
        with psycopg.connect(f"host=127.0.0.1 port={port} user=postgres dbname=postgres", autocommit=True) as c:
            end = time.time() + seconds
            while time.time() < end:
                c.execute("select 1").fetchone()
    threads = [threading.Thread(target=loop) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
""")


@pytest.fixture(scope="module")
def fp():
    with foreign_path() as path:
        yield path


def _attached(fp, runs_dir, tmp_path) -> tuple[dict, str]:
    """attach (3 s, sampled traces) to the application running through the path; (its document, its comm). One
    transaction in 200 traced: ~350 traces, each with the client's spans; one in 20 made 67,000 spans whose OTLP
    export alone took 7 s of the test's 25 (42 beside the other lane)."""
    app = tmp_path / "app.py"
    app.write_text(APP)
    # bounded by itself (60 s), killed once attach is done
    load = subprocess.Popen([PYTHON3, str(app), str(fp["port"]), "60"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        wait_connected(fp["port"], 2)
        time.sleep(1)
        comm = Path(f"/proc/{load.pid}/comm").read_text().strip()
        cp = run_pathprof("attach", "--port", str(fp["port"]), "--duration", "3", "--trace-sample", "200", "--json",
                          "--no-live", runs_dir=runs_dir)
        assert load.poll() is None, load.communicate()[1][-2000:]      # the application outlived the attach
    finally:
        load.kill()
        load.communicate(timeout=30)
    assert cp.returncode == 0, cp.stderr[-3000:]
    return json.loads(cp.stdout), comm


def test_a_python_client_is_named_after_its_program(fp, runs_dir, tmp_path):
    doc, comm = _attached(fp, runs_dir, tmp_path)
    assert comm == "python3"
    run = json.loads((Path(doc["run_dir"]) / "run.json").read_text())
    assert run["workload"]["client"] == "python3" and doc["workload"]["client"] == "python3"
    topo = json.loads((Path(doc["run_dir"]) / "topology.json").read_text())
    assert [c["process"] for c in topo["chain"]] == ["python3", "pgbouncer", "postgres"], topo["chain"]
    stages = {s["name"] for s in doc["stages"]}
    components = {c["component"] for c in doc["cpu"]}
    assert {"client.python3", "wire.python3", "hop.pgbouncer", "backend.execute"} <= stages, stages
    assert {"python3.user", "python3.sys"} & components, components
    assert not [n for n in stages | components if "pgbench" in n], stages | components
    # the client's own work is a real share of the cycle (the application's Python between two queries)
    client_us = sum(s["us_per_txn"] for s in doc["stages"] if s["name"] == "client.python3")
    assert client_us > 0.05 * doc["closure"]["stages_sum_us"], (client_us, doc["closure"])
    assert abs(doc["closure"]["latency_error_pct"]) <= 10, doc["closure"]

    # OTLP spans: the client's stages and its role by the same name
    body = Path(doc["run_dir"]) / "spans.json"
    cp = run_pathprof("export", doc["run_dir"], "--format", "otlp", "-o", str(body))
    assert cp.returncode == 0, cp.stderr[-2000:]
    spans = flatten(parse_json(body.read_bytes()))
    kids = [s for s in spans if s["parent"]]
    assert kids and any(s["name"] == "client.python3" for s in kids), {s["name"] for s in kids}
    roles = {s["attrs"].get("pathprof.role", "") for s in kids}
    assert "python3" in roles, roles
    assert not [s for s in kids if "pgbench" in s["name"]] and not [r for r in roles if "pgbench" in r], roles

    # OpenMetrics: every sample's labels, the stage histograms included
    cp = run_pathprof("export", doc["run_dir"], "--format", "openmetrics")
    assert cp.returncode == 0, cp.stderr[-2000:]
    samples = [line for line in cp.stdout.splitlines() if not line.startswith("#")]
    assert any('stage="client.python3"' in line for line in samples), samples[:20]
    assert not [line for line in samples if "pgbench" in line]

    # the text report says it too
    rep = run_pathprof("report", doc["run_dir"])
    assert rep.returncode == 0 and "client.python3" in rep.stdout and "pgbench" not in rep.stdout, rep.stdout
