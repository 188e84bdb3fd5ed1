"""The TPC-C-like workload: loads, runs the five transaction types in the standard mix, reports each."""
import json

import pytest
from conftest import machine_state, run_pathprof

pytestmark = pytest.mark.integration
TYPES = ["new_order", "payment", "order_status", "delivery", "stock_level"]


def test_tpcc_loads_runs_and_reports_five_transaction_types(runs_dir):
    before = machine_state()
    cp = run_pathprof("run", "--topology", "unix", "--script", "tpcc", "--scale", "1", "--clients", "4",
                      "--duration", "3", "--json", runs_dir=runs_dir, check=True, timeout=600)
    assert machine_state() == before
    doc = json.loads(cp.stdout)
    scripts = doc["scripts"]
    assert [s["name"].rsplit("/", 1)[1] for s in scripts] == [f"tpcc_{t}.sql" for t in TYPES]
    counts = [s["transactions"] for s in scripts]
    assert all(c > 0 for c in counts) and sum(counts) <= doc["transactions"] + 5
    # the standard mix: New-Order and Payment ~45/43 %, the other three ~4 % each
    share = {t: c / sum(counts) for t, c in zip(TYPES, counts)}
    assert 0.35 < share["new_order"] < 0.55 and 0.33 < share["payment"] < 0.53, share
    assert all(share[t] < 0.1 for t in TYPES[2:]), share
    # every statement of every type has its own latency (pgbench -r), and Delivery (ten districts) is the
    # heaviest single transaction
    assert all(s["statements"] and all(st["latency_ms"] >= 0 for st in s["statements"]) for s in scripts)
    lat = {t: s["latency_ms"]["mean"] for t, s in zip(TYPES, scripts)}
    assert lat["delivery"] > lat["order_status"], lat
    assert "new_order" in run_pathprof("report", doc["run_dir"], check=True).stdout


def test_tpcc_scale_zero_is_refused(runs_dir):
    cp = run_pathprof("run", "--script", "tpcc", "--scale", "0", "--probes", "off", runs_dir=runs_dir)
    assert cp.returncode == 2 and "--scale" in cp.stderr and "Traceback" not in cp.stderr
