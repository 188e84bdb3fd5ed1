"""OpenMetrics export and the live metrics endpoint, read back with prometheus_client's own OpenMetrics parser."""
import re
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from fixtures_summaries import dnat
from pathprof.analysis.export.metrics_server import MetricsServer
from pathprof.analysis.export.openmetrics import CONTENT_TYPE, render, stage_histograms
from pathprof.analysis.rundir import RunDir
from pathprof.analysis.summary import summarize
from pathprof.errors import UserError
from prometheus_client.openmetrics.parser import text_string_to_metric_families

RUNS = Path(__file__).parent / "data" / "runs"


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_export_of_a_recorded_run_parses_and_matches_the_summary():
    rd = RunDir.open(RUNS / "docker-dnat")
    s = {**summarize(rd), "run_id": "r1"}
    hists = stage_histograms(rd.read_frame("stages.parquet"))
    fams = families(render([s], {"r1": hists}))
    assert fams["pathprof_tps"].samples[0].value == pytest.approx(s["tps"])
    assert fams["pathprof_tps"].samples[0].labels == {"run": "r1", "topology": "docker-dnat"}
    stages = {(x.labels["stage"], x.labels["leg"]): x.value
              for x in fams["pathprof_stage_per_transaction_seconds"].samples}
    for st in s["stages"]:
        assert stages[(st["name"], st["leg"])] == pytest.approx(st["us_per_txn"] / 1e6)
    cpu = {x.labels["component"]: x.value for x in fams["pathprof_cpu_per_transaction_seconds"].samples}
    assert cpu == pytest.approx({c["component"]: c["us_per_txn"] / 1e6 for c in s["cpu"]})
    assert fams["pathprof_latency_seconds"].unit == "seconds"
    info = fams["pathprof_run"]
    assert info.type == "info" and info.samples[0].labels["regime"] == s["regime"]
    # histograms: cumulative, ending in +Inf == count, one series per (stage, leg) with a histogram
    h = fams["pathprof_stage_duration_seconds"]
    assert h.type == "histogram"
    series: dict = {}
    for x in h.samples:
        series.setdefault((x.labels["stage"], x.labels["leg"]), []).append(x)
    assert len(series) == len(hists) > 10
    for key, samples in series.items():
        buckets = [(float(x.labels["le"]), x.value) for x in samples if x.name.endswith("_bucket")]
        assert buckets[-1][0] == float("inf")
        assert [b for b, _ in buckets] == sorted(b for b, _ in buckets)
        assert [v for _, v in buckets] == sorted(v for _, v in buckets)
        count = next(x.value for x in samples if x.name.endswith("_count"))
        assert buckets[-1][1] == count
        src = next(hh for hh in hists if (hh["name"], hh["leg"]) == key)
        assert count == sum(src["slots"])
        total = next(x.value for x in samples if x.name.endswith("_sum"))
        assert total == pytest.approx(src["sum_ns"] / 1e9)


def test_label_values_are_escaped():
    s = {**dnat(), "topology": 'odd "name"\\with\nnewline'}
    fams = families(render([s]))
    assert fams["pathprof_tps"].samples[0].labels["topology"] == 'odd "name"\\with\nnewline'


def test_export_command_writes_openmetrics(tmp_path):
    out = tmp_path / "m.txt"
    r = subprocess.run([sys.executable, "-m", "pathprof.agent.cli.main", "export", str(RUNS / "loopback"), "--format",
                        "openmetrics", "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    fams = families(out.read_text())
    assert fams["pathprof_run"].samples[0].labels["topology"] == "loopback"
    assert fams["pathprof_stage_duration_seconds"].samples


def scrape(url: str) -> tuple[str, str]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.headers["Content-Type"], resp.read().decode()


def test_metrics_server_serves_live_snapshots():
    state = {"n": 0}
    lock = threading.Lock()

    def snapshot():
        with lock:
            state["n"] += 1
            n = state["n"]
        return {"topology": "loopback", "run_id": "live", "tps": 1000.0 * n, "latency_ms": {"mean": 0.5},
                "stages": [{"name": "wire.backend", "leg": "request", "us_per_txn": 3.0 * n}],
                "cpu": [{"component": "backend.sys", "us_per_txn": 4.0}]}

    with MetricsServer(0, snapshot) as server:
        assert server.host == "127.0.0.1" and server.port > 0
        ctype, first = scrape(server.url)
        assert ctype == CONTENT_TYPE
        _, second = scrape(server.url)
        a, b = families(first), families(second)
        assert a["pathprof_tps"].samples[0].value == 1000.0 and b["pathprof_tps"].samples[0].value == 2000.0
        assert b["pathprof_stage_per_transaction_seconds"].samples[0].value == pytest.approx(6e-6)
        with pytest.raises(urllib.error.HTTPError) as e:
            scrape(server.url.replace("/metrics", "/nope"))
        assert e.value.code == 404
        # the port is taken while it runs: a second server says so in one sentence
        with pytest.raises(UserError, match="already in use"):
            MetricsServer(server.port, snapshot).start()
        port = server.port
    # stopped: nothing listens any more, and the port can be bound again
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    with MetricsServer(port, lambda: None) as again:
        _, text = scrape(again.url)
        assert list(families(text)) == []          # nothing to report yet: a valid empty exposition


def test_metrics_server_survives_a_failing_snapshot():
    def broken():
        raise RuntimeError("probe map gone")

    with MetricsServer(0, broken) as server:
        with pytest.raises(urllib.error.HTTPError) as e:
            scrape(server.url)
        assert e.value.code == 500
        with pytest.raises(urllib.error.HTTPError):    # and keeps answering
            scrape(server.url)


def test_serving_wraps_a_run_reporter():
    from pathprof.agent.cli.metrics_live import serving
    from pathprof.agent.postgres.pgbench import Progress
    from pathprof.agent.run.options import Reporter

    class Seen(Reporter):
        def __init__(self):
            self.calls = []

        def progress(self, pr, snap):
            self.calls.append(pr.tps)

        def note(self, text):
            self.calls.append(text)

    inner = Seen()
    with serving(None, inner, {}) as ui:
        assert ui is inner                                  # no port: nothing served, nothing wrapped
    with serving(0, inner, {"topology": "nic", "run_id": "live", "clients": 4}) as ui:
        url = re.search(r"http://127\.0\.0\.1:\d+/metrics", inner.calls[-1]).group(0)
        before = families(scrape(url)[1])
        assert before["pathprof_clients"].samples[0].value == 4 and "pathprof_tps" not in before
        ui.progress(Progress(elapsed_s=1.0, tps=1234.0, latency_ms=0.8), None)
        ui.progress(Progress(elapsed_s=2.0, tps=1500.0, latency_ms=0.7),
                    {"stages": [{"name": "wire.backend", "leg": "request", "us_per_txn": 5.0}], "cpu": []})
        fams = families(scrape(url)[1])
        assert inner.calls[-2:] == [1234.0, 1500.0]         # the run's own reporter still sees everything
        assert fams["pathprof_tps"].samples[0].value == 1500.0
        assert fams["pathprof_latency_seconds"].samples[0].value == pytest.approx(0.0007)
        assert fams["pathprof_stage_per_transaction_seconds"].samples[0].labels["stage"] == "wire.backend"
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=2)
