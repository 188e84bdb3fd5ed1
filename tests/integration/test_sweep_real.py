"""sweep on a real path: one run per client count, the knee and the growing stage named from those runs."""
import json

import pytest
from conftest import machine_state, run_pathprof

pytestmark = pytest.mark.integration


def test_sweep_unix(runs_dir):
    before = machine_state()
    cp = run_pathprof("sweep", "--topology", "unix", "--clients", "4,1,2", "--duration", "1", "--json",
                      runs_dir=runs_dir, check=True, timeout=600)
    doc = json.loads(cp.stdout)
    assert [r["clients"] for r in doc["runs"]] == [1, 2, 4]
    sw = doc["sweep"]
    assert [p["clients"] for p in sw["points"]] == [1, 2, 4]
    assert [p["tps"] for p in sw["points"]] == [r["tps"] for r in doc["runs"]]
    # unix, 2 CPUs: one client leaves a CPU idle, so a second one must add throughput -- the knee cannot be
    # at 1 client, and when there is one the reason names it
    assert sw["points"][1]["tps"] > sw["points"][0]["tps"], sw["points"]
    assert sw["knee_clients"] != 1, sw
    assert (sw["knee_clients"] is None) == (sw["knee_reason"] is None)
    if sw["knee_clients"]:
        assert f"from {sw['knee_clients']} to" in sw["knee_reason"]
    names = {s["name"] for r in doc["runs"] for s in r["stages"]}
    assert sw["growing_stage"] in names
    assert machine_state() == before


def test_sweep_rejects_bad_counts(runs_dir):
    cp = run_pathprof("sweep", "--topology", "unix", "--clients", "1,x", runs_dir=runs_dir)
    assert cp.returncode == 2 and "comma-separated" in cp.stderr and "Traceback" not in cp.stderr
