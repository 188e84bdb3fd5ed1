"""One path twice on one machine (two pods with a sidecar pooler, two copies of a deployment, the suite's two
lanes): each copy's server in a namespace of its own with the same addresses, so a connection can have the same
four addresses in both, and the kernel's ephemeral ports, which do not depend on the namespace, make that happen
by themselves. `attach` must follow its own copy: found in CI (stop 51) as an attach that counted the other
lane's load, 25,510 TPS for a 17,000-TPS application, and closed at -43.59 %.

Ground truth built here: foreign_path.py's hand-built path (pgbouncer in front of a server behind a veth) and a
twin of its server side made first (its processes come first in /proc), with a session to the twin's server
from each source port the pooler uses to reach its own."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))
from conftest import run_pathprof  # noqa: E402
from foreign_path import DB_IP, HOST_IP, foreign_path, pgbench, twin_server, wait_connected  # noqa: E402

pytestmark = pytest.mark.integration


def _pooler_source_ports() -> list[int]:
    """The ports the pooler connects to its server from (this namespace, HOST_IP -> DB_IP:5432)."""
    out = subprocess.run(["ss", "-Htn", "state", "established", f"( dst {DB_IP} and dport = :5432 )"],
                         capture_output=True, text=True, check=True).stdout
    return sorted(int(line.split()[2].rsplit(":", 1)[1]) for line in out.splitlines()
                  if line.split()[2].startswith(f"{HOST_IP}:"))


def test_attach_follows_its_own_copy_of_a_path_that_exists_twice(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root (namespaces, a server of its own)")
    with twin_server() as session_from, foreign_path() as fp:
        load = pgbench(fp["port"], 2, 60, str(tmp_path))
        try:
            wait_connected(fp["port"], 2)
            ports = _pooler_source_ports()
            assert ports, "the pooler holds no connection to its server"
            for port in ports:             # the same four addresses, in the twin's namespaces
                session_from(port)
            cp = run_pathprof("attach", "--port", str(fp["port"]), "--duration", "3", "--json", "--no-live",
                              runs_dir=tmp_path / "runs")
        finally:
            load.kill()
            load.communicate(timeout=30)
    assert cp.returncode == 0, cp.stderr[-3000:]
    doc = json.loads(cp.stdout)
    topo = json.loads((Path(doc["run_dir"]) / "topology.json").read_text())
    server = [c for c in topo["chain"] if c["process"] == "postgres"]
    assert [c["pid"] for c in server] == [fp["postmaster"]], (fp["postmaster"], topo["chain"])
    assert [c["process"] for c in topo["chain"]] == ["pgbench", "pgbouncer", "postgres"], topo["chain"]
    # its exchanges are the load's: the pooler's server connections are idle in the twin
    assert doc["tps"] > 0 and abs(doc["closure"]["latency_error_pct"]) <= 10, doc["closure"]
