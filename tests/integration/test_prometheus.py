"""Prometheus for real: Debian's prometheus scrapes a live run's --metrics-port, evaluates the shipped recording
rules, and the figures come back through its HTTP API equal to what the run itself reports."""
import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from conftest import PATHPROF, ROOT

pytestmark = pytest.mark.integration
RULES = ROOT / "docs" / "prometheus" / "pathprof.rules.yml"
PROMETHEUS = shutil.which("prometheus")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _query(base: str, expr: str, at: float | None = None) -> list[dict]:
    args = {"query": expr} | ({"time": repr(at)} if at is not None else {})
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode(args)
    with urllib.request.urlopen(url, timeout=5) as r:
        doc = json.load(r)
    assert doc["status"] == "success", doc
    return doc["data"]["result"]


def test_promtool_accepts_the_shipped_rules():
    if not shutil.which("promtool"):
        pytest.skip("promtool is not installed (scripts/setup.sh installs prometheus)")
    cp = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True, text=True)
    assert cp.returncode == 0 and "SUCCESS: 5 rules found" in cp.stdout, cp.stdout + cp.stderr


@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus is not installed (scripts/setup.sh installs it)")
def test_prometheus_scrapes_a_live_run_and_records_the_rules(tmp_path):
    err = tmp_path / "run.err"
    run = subprocess.Popen([*PATHPROF, "run", "--topology", "loopback", "--clients", "2", "--duration", "7",
                            "--probe-window", "1", "--probe-period", "2", "--metrics-port", "0", "--no-live",
                            "--json"], stdout=subprocess.PIPE, stderr=open(err, "w"), stdin=subprocess.DEVNULL,
                           env={**os.environ, "PATHPROF_RUNS": str(tmp_path / "runs")}, text=True)
    prom = None
    try:
        target = None
        for _ in range(120):
            if m := re.search(r"serving live metrics at http://(127\.0\.0\.1:\d+)/metrics", err.read_text()):
                target = m.group(1)
                break
            assert run.poll() is None, err.read_text()[-3000:]
            time.sleep(0.25)
        assert target, err.read_text()[-2000:]
        web = f"127.0.0.1:{_free_port()}"
        config = tmp_path / "prometheus.yml"
        config.write_text(f"global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files: ['{RULES}']\n"
                          f"scrape_configs:\n  - job_name: pathprof\n    static_configs:\n"
                          f"      - targets: ['{target}']\n")
        prom = subprocess.Popen([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                 f"--web.listen-address={web}"], stdout=subprocess.DEVNULL,
                                stderr=open(tmp_path / "prometheus.log", "w"))
        base, seen, live_at = f"http://{web}", {}, None
        names = ("pathprof_tps", "pathprof_clients", "pathprof:cycle:seconds", "pathprof:stage_share:ratio",
                 "pathprof_stage_per_transaction_seconds")
        while run.poll() is None:
            time.sleep(1)
            # every series at one instant a little in the past, fixed: the same query at `live_at` below answers the
            # same. Not `seen` accumulated over the loop (ci46a-4: the run's metrics server had closed while the
            # process still wrote its results, the series went stale, and an instant after that read nothing)
            t = time.time() - 0.5
            try:
                now = {name: r for name in names if (r := _query(base, name, t))}
            except OSError:
                continue                      # Prometheus still starting
            seen.update(now)
            if len(now) == len(names) and run.poll() is None:
                live_at = t                   # every series present at t, while the target was up
        out = run.stdout.read()
        assert run.returncode == 0, err.read_text()[-3000:]
        # a rule evaluation while the run was live, and the raw series as Prometheus held them at that instant
        assert live_at, (sorted(seen), (tmp_path / "prometheus.log").read_text()[-2000:])
        at = float(_query(base, "timestamp(pathprof:stage_share:ratio)", live_at)[0]["value"][1])
        shares = {(r["metric"]["stage"], r["metric"]["leg"]): float(r["value"][1])
                  for r in _query(base, "pathprof:stage_share:ratio", at)}
        stages = {(r["metric"]["stage"], r["metric"]["leg"]): float(r["value"][1])
                  for r in _query(base, "pathprof_stage_per_transaction_seconds", at)}
        cycle = float(_query(base, "pathprof:cycle:seconds", at)[0]["value"][1])
        tps = float(_query(base, "pathprof_tps", at)[0]["value"][1])
    finally:
        if run.poll() is None:
            run.terminate()
            run.wait(timeout=60)
        if prom is not None:
            prom.terminate()
            prom.wait(timeout=30)
    doc = json.loads(out)
    log = (tmp_path / "prometheus.log").read_text()[-2000:]
    assert "pathprof_tps" in seen, log
    assert float(seen["pathprof_clients"][0]["value"][1]) == 2
    assert float(seen["pathprof_tps"][0]["value"][1]) > 0
    # the recorded cycle is clients / TPS of the same scrape, computed by Prometheus from the rule file
    assert cycle == pytest.approx(2 / tps, rel=1e-9)
    # the stages came through with their names and legs, and each share is the stage over the sum of stages
    assert ("backend.execute", "server") in stages and ("wire.backend", "request") in stages
    assert set(shares) == set(stages)
    total = sum(stages.values())
    for key, value in stages.items():
        assert shares[key] == pytest.approx(value / total, rel=1e-6, abs=1e-12)
    # and the run's own final report names the same stages Prometheus stored
    assert {(s["name"], s["leg"]) for s in doc["stages"]} >= {("backend.execute", "server")}
    assert Path(doc["run_dir"]).exists()
