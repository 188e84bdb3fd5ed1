import base64
import random
import re

from fixtures_summaries import bridge, dnat, sweep_runs
from pathprof.analysis.explain import explain, explain_text
from pathprof.analysis.report.html import write_html
from pathprof.analysis.sweep import sweep_analysis, sweep_text

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_compare_report(tmp_path):
    b, d = bridge(), dnat()
    d["closure"]["latency_error_pct"] = 9.0
    expl = explain(b, d)
    rng = random.Random(1)
    samples = {"docker-bridge": [rng.lognormvariate(-1.4, 0.4) for _ in range(500)],
               "docker-dnat": [rng.lognormvariate(-0.8, 0.4) for _ in range(500)]}
    path = write_html([b, d], tmp_path / "report.html", explanations=[expl], latency_samples=samples)
    doc = path.read_text()
    assert doc.startswith("<!DOCTYPE html>") and "<style>" in doc
    assert not re.search(r"<script[^>]*\bsrc=", doc) and not re.search(r"<link[^>]*\bhref=", doc)  # inline only
    assert "http://" not in doc and "https://" not in doc            # self-contained
    sentence = explain_text(expl)
    assert sentence in doc
    assert doc.index(sentence) < doc.index("<img")                   # explanation at the top
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', doc)
    assert len(images) == 4                                          # stages, cpu, cdf, tps
    assert all(base64.b64decode(i).startswith(PNG_MAGIC) for i in images)
    for name in ("stages", "cpu", "latency-cdf", "tps"):
        assert (tmp_path / f"report-{name}.png").read_bytes().startswith(PNG_MAGIC)
    # caveats visible: closure that fails, probe cost
    assert "does not close (+9.0 %)" in doc and "850 ns" in doc
    assert "hop.docker-proxy" in doc and "88.1 %" in doc
    assert "userland-proxy on" in doc


def test_single_run_and_sweep(tmp_path):
    path = write_html([bridge()], tmp_path / "one.html")
    doc = path.read_text()
    assert "docker-bridge: 64,765 TPS" in doc and "runqueue.pgbench" in doc
    assert not (tmp_path / "one-latency-cdf.png").exists()           # no samples, no CDF
    runs = sweep_runs()
    sw = sweep_analysis(runs)
    doc = write_html(runs, tmp_path / "sweep.html", sweep=sw).read_text()
    assert sweep_text(sw) in doc
    assert (tmp_path / "sweep-sweep.png").exists()
    assert "loopback (4 cl.)" in doc


def test_same_input_same_png(tmp_path):
    write_html([bridge(), dnat()], tmp_path / "a.html")
    write_html([bridge(), dnat()], tmp_path / "b.html")
    assert (tmp_path / "a-stages.png").read_bytes() == (tmp_path / "b-stages.png").read_bytes()


def test_stacked_stages_never_count_a_stage_and_its_parts_twice():
    """The latency bars stack stages by cause: backend.execute's exclusive parts and overlapping phases are inside
    it, so the stack's height is the view's total, and the report's table of them says which is which."""
    from pathprof.analysis.report.charts import stage_groups
    from pathprof.analysis.report.html import _run_section as run_section
    st = [{"name": "wire.backend", "leg": "request", "us_per_txn": 20.0},
          {"name": "backend.execute", "leg": "server", "us_per_txn": 600.0},
          {"name": "backend.executor", "leg": "server", "us_per_txn": 500.0, "parent": "backend.execute",
           "phase": True},
          {"name": "backend.wal_flush", "leg": "server", "us_per_txn": 300.0, "parent": "backend.execute",
           "part": True},
          {"name": "backend.execute.other", "leg": "server", "us_per_txn": 300.0, "parent": "backend.execute",
           "part": True}]
    assert sum(stage_groups({"stages": st}, set()).values()) == 620.0
    page = run_section({"topology": "loopback", "clients": 4, "tps": 100.0, "stages": st})
    assert "add up to it" in page and "· backend.executor" in page


def test_the_run_section_has_the_pooler_check_the_backends_served_and_a_divisor_caveat():
    from pathprof.analysis.report.html import _run_section as run_section
    row = {"hop": "pgpool", "source": "SHOW POOL_POOLS", "servers_are": "child", "busy_is": "busy", "samples": 9,
           "cl_waiting_mean": 3.1, "cl_waiting_max": 4, "servers": 1, "servers_busy_mean": 0.5,
           "wait_stages": {"connect.hop_accept": 7748.0}, "tps": 396.0, "expected_waiting": 3.06, "agrees": True}
    served = {"transactions": 10, "backends": [{"pid": 42, "transactions": 10, "via": {"pgpool": [9]}}],
              "listed": [], "spans_read": 100, "spans": 100}
    page = run_section({"topology": "pgpool", "clients": 4, "tps": 396.0, "stages": [], "pooler_counters": [row],
                        "served_by": served, "closure": {"connect_divisors": {"statement": "depends on a divisor"}}})
    assert "clients waiting for a child 3.10" in page and "predicts 3.06: agrees" in page
    assert "served by 1 backend(s): 42 100 % via pgpool 9" in page
    assert '<p class="caveat">depends on a divisor</p>' in page
