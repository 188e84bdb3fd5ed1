"""A real run's HTML report in a real browser (Debian's chromium, headless), and its live metrics scraped while
it runs: the page renders without script errors, the path diagram has one element per process and device of the
path with its figure, the waterfall is drawn from the sampled traces; a screenshot is kept in the test's tmp
directory. The live endpoint serves OpenMetrics that prometheus_client's parser reads, and is gone after the run.
"""
import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

import pytest
from conftest import PATHPROF, machine_state, run_pathprof
from prometheus_client.openmetrics.parser import text_string_to_metric_families

pytestmark = pytest.mark.integration
CHROMIUM = shutil.which("chromium")


def _state() -> dict:
    # loop devices and mounts belong to --wal-device runs, which this test does not make (and which other
    # sessions on a shared machine may be making right now)
    return {k: v for k, v in machine_state().items() if k not in ("loops", "mounts")}


def chromium(*args, tmp: Path, timeout=90) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars",
                           f"--user-data-dir={tmp / 'chromium-profile'}", "--enable-logging=stderr", "--v=0", *args],
                          capture_output=True, text=True, timeout=timeout)


def console_errors(stderr: str) -> list[str]:
    """Script errors chromium logged: uncaught exceptions and console.error lines."""
    return [ln for ln in stderr.splitlines()
            if "Uncaught" in ln or re.search(r":(ERROR|WARNING):CONSOLE", ln) or "CONSOLE" in ln and "rror" in ln]


class Elements(HTMLParser):
    def __init__(self):
        super().__init__()
        self.found, self.root = [], {}

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "html":
            self.root = a
        if "data-element" in a:
            self.found.append(a)


def dom_of(url: str, tmp: Path) -> tuple[Elements, str]:
    cp = chromium("--dump-dom", url, tmp=tmp)
    assert cp.returncode == 0, cp.stderr[-2000:]
    p = Elements()
    p.feed(cp.stdout)
    return p, cp.stderr


def _start_run(runs_dir: Path, port_file: Path) -> subprocess.Popen:
    env = {**os.environ, "PATHPROF_RUNS": str(runs_dir)}
    return subprocess.Popen([*PATHPROF, "run", "--topology", "pgbouncer", "--clients", "2", "--duration", "5",
                             "--trace-sample", "20", "--metrics-port", "0", "--no-live", "--json",
                             "--probe-lo-device"],    # lo timed, so the drawing has devices to check
                            stdout=subprocess.PIPE, stderr=open(port_file, "w"), stdin=subprocess.DEVNULL, env=env,
                            text=True)


def _scrape(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as r:
        return {f.name: f for f in text_string_to_metric_families(r.read().decode())}


def _run_with_live_scrape(runs_dir: Path, tmp: Path) -> tuple[dict, list[dict]]:
    """Run pgbouncer with --metrics-port 0; scrape while it runs. Retries while another session holds the
    path's fixed namespaces ("already exists")."""
    for attempt in range(6):
        log = tmp / f"run-{attempt}.err"
        proc = _start_run(runs_dir, log)
        url, scrapes = None, []
        while proc.poll() is None:
            text = log.read_text()
            if url is None and (m := re.search(r"serving live metrics at (http://127\.0\.0\.1:\d+/metrics)", text)):
                url = m.group(1)
            if url:
                try:
                    scrapes.append(_scrape(url))
                except OSError:
                    pass
            time.sleep(0.5)
        out = proc.stdout.read()
        err = log.read_text()
        if proc.returncode != 0 and "already exists" in err:
            time.sleep(30)
            continue
        assert proc.returncode == 0, err[-3000:]
        assert url, err[-2000:]
        port = int(url.split(":")[2].split("/")[0])
        with pytest.raises(OSError):          # the endpoint is gone with the run
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return json.loads(out), scrapes
    pytest.skip("the pgbouncer path stayed in use by another session")


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (scripts/setup.sh installs it)")
def test_report_in_a_real_browser_and_live_metrics(tmp_path):
    before = _state()
    runs_dir = tmp_path / "runs"
    doc, scrapes = _run_with_live_scrape(runs_dir, tmp_path)
    assert _state() == before

    # live metrics: TPS while pgbench ran, and the stages once a measurement window had closed
    live_tps = [f["pathprof_tps"].samples[0].value for f in scrapes if "pathprof_tps" in f]
    assert live_tps and max(live_tps) > 0
    staged = [f for f in scrapes if "pathprof_stage_per_transaction_seconds" in f]
    assert staged, "no scrape carried the probes' stages"
    names = {s.labels["stage"] for s in staged[-1]["pathprof_stage_per_transaction_seconds"].samples}
    assert "hop.pgbouncer" in names and "backend.execute" in names

    run_dir = Path(doc["run_dir"])
    assert (run_dir / "traces.parquet").exists()
    html = tmp_path / "report.html"
    run_pathprof("report", str(run_dir), "--html", str(html), check=True)
    url = html.as_uri()
    page, stderr = dom_of(url, tmp_path)
    assert page.root.get("data-ready") == "1", "the report's script did not run to its end"
    assert "data-js-error" not in page.root, page.root.get("data-js-error")
    assert console_errors(stderr) == []

    topo = json.loads((run_dir / "topology.json").read_text())
    chain = [c.get("hop") or c.get("process") for c in topo["chain"] if c.get("hop") or c.get("process")]
    procs = [e for e in page.found if e["data-element"] == "process"]
    assert [e["data-name"] for e in procs] == ["pgbench" if c == "pgbench" else "backend" if c == "postgres"
                                               else c for c in chain]
    assert all(float(e["data-us-per-txn"]) > 0 and float(e["data-cpu-us-per-txn"]) > 0 for e in procs)
    # every device the latency view timed is on the drawing, once per leg, with its figure
    devices = {(e["data-name"], e["data-leg"]): float(e["data-us-per-txn"])
               for e in page.found if e["data-element"] == "device"}
    timed = {(s["name"], s["leg"]): s["us_per_txn"] for s in doc["stages"] if s["name"].startswith("dev.")}
    assert timed and devices == pytest.approx(timed, abs=1e-3)
    hosts = [e["data-name"] for e in page.found if e["data-element"] == "host"]
    assert hosts == list(topo["hosts"])
    # the waterfall: every message of a sampled transaction carries its number (probes: send_number), so the
    # sample holds whole transactions and the typical one crosses every process of the path
    rows = {e["data-row"] for e in page.found if e["data-element"] == "span"}
    assert "no sampled transaction is complete" not in html.read_text()
    assert rows == {"pgbench", "pgbouncer", "backend"}

    shot = tmp_path / "report.png"
    cp = chromium(f"--screenshot={shot}", "--window-size=1280,2400", url, tmp=tmp_path)
    assert cp.returncode == 0 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20000

    # the stage table sorts by a click on a column head (the page's own script, driven in the browser)
    clicked = tmp_path / "clicked.html"
    clicked.write_text(html.read_text().replace("</body>", """<script>
var t=[].find.call(document.querySelectorAll('table.sortable'),function(x){return /stage/.test(x.tHead.textContent)});
var i=[].findIndex.call(t.tHead.rows[0].cells,function(c){return c.textContent==='µs/txn'});
t.tHead.rows[0].cells[i].click();
document.documentElement.setAttribute('data-sorted',[].map.call(t.tBodies[0].rows,function(r){
return r.cells[i].textContent}).join('|'));</script></body>"""))
    page, _ = dom_of(clicked.as_uri(), tmp_path)
    values = [float(v.replace(",", "")) for v in page.root["data-sorted"].split("|")]
    assert len(values) == len([s for s in doc["stages"] if not s.get("parent")]) and values == sorted(values)

    # the check above would have seen a broken page: a script error is caught the same way
    bad = tmp_path / "bad.html"
    bad.write_text(html.read_text().replace("</body>", "<script>undefinedFunction();</script></body>"))
    page, stderr = dom_of(bad.as_uri(), tmp_path)
    assert "data-js-error" in page.root and console_errors(stderr)
