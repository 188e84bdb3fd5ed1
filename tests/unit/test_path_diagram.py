"""The path diagram, the waterfall and the cause-grouped charts of the HTML report, rendered from run directories
recorded by real runs (tests/unit/data/runs) and from topology.json shapes a real run could write."""
import json
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest
from fixtures_summaries import bridge, dnat
from pathprof.analysis.report import path_model, svg_path, waterfall
from pathprof.analysis.report.html import write_html
from pathprof.analysis.rundir import RunDir
from pathprof.analysis.summary import summarize

RUNS = Path(__file__).parent / "data" / "runs"


class Elements(HTMLParser):
    """Every tag carrying data-element, with its attributes; and the text of <script> blocks."""

    def __init__(self):
        super().__init__()
        self.found: list[dict] = []
        self.tables: list[dict] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "data-element" in a:
            self.found.append({"tag": tag, **a})
        if tag == "table":
            self.tables.append(a)

    def of(self, element: str) -> list[dict]:
        return [e for e in self.found if e["data-element"] == element]


def parse(doc: str) -> Elements:
    p = Elements()
    p.feed(doc)
    return p


def summary_of(name: str, tmp_path: Path | None = None) -> dict:
    src = RUNS / name
    if tmp_path is not None:           # a copy the test may change
        dst = tmp_path / name
        shutil.copytree(src, dst)
        src = dst
    return summarize(RunDir.open(src))


def drawn_total(p: Elements) -> float:
    """µs per transaction of every element with a figure: processes and the chips between them."""
    kinds = ("process", "wire", "device", "qdisc", "delay", "netfilter")
    return sum(float(e["data-us-per-txn"]) for e in p.found if e["data-element"] in kinds and e["data-us-per-txn"])


def test_docker_dnat_diagram_from_the_recorded_run(tmp_path):
    s = summary_of("docker-dnat")
    doc = write_html([s], tmp_path / "r.html").read_text()
    p = parse(doc)
    assert doc.index('class="pp-path"') < doc.index("<h2>Where the time goes")       # the report opens with it
    procs = {e["data-name"]: e for e in p.of("process")}
    topo = json.loads((RUNS / "docker-dnat" / "topology.json").read_text())
    chain = [c.get("hop") or c.get("process") for c in topo["chain"] if c.get("hop") or c.get("process")]
    assert list(procs) == ["pgbench" if c == "pgbench" else "backend" if c == "postgres" else c for c in chain]
    assert {e["data-name"] for e in p.of("host")} == set(topo["hosts"])
    # every stage of the latency view is drawn exactly once: the drawing adds up to the stage total
    total = sum(st["us_per_txn"] for st in s["stages"] if not st.get("parent"))
    assert drawn_total(p) == pytest.approx(total, rel=1e-3)
    # the proxy is the biggest element, and says so: largest figure and share on the page
    proxy = procs["docker-proxy"]
    others = [float(e["data-us-per-txn"]) for e in p.found if e.get("data-us-per-txn") and e is not proxy]
    assert float(proxy["data-us-per-txn"]) > max(others)
    assert float(proxy["data-share-pct"]) > 50
    assert float(proxy["data-cpu-us-per-txn"]) == pytest.approx(
        sum(c["us_per_txn"] for c in s["cpu"] if c["component"].startswith("hop.docker-proxy.")), abs=0.01)
    # every device of the spec appears: the timed ones with a figure, the bridge without one
    devices = {(e["data-name"], e["data-leg"]): e["data-us-per-txn"] for e in p.of("device")}
    assert devices[("dev.pp-dk-veth0", "request")] and devices[("dev.pp-dk-eth0", "response")]
    assert devices[("dev.pp-docker0", "request")] == ""
    hooks = {e["data-name"] for e in p.of("netfilter")}
    assert {"netfilter.output.pp-dk-host", "netfilter.prerouting.pp-dk-host"} <= hooks


def test_loopback_and_unix_diagrams(tmp_path):
    for name in ("loopback", "unix"):
        s = summary_of(name)
        p = parse(write_html([s], tmp_path / f"{name}.html").read_text())
        assert [e["data-name"] for e in p.of("process")] == ["pgbench", "backend"]
        total = sum(st["us_per_txn"] for st in s["stages"] if not st.get("parent"))
        assert drawn_total(p) == pytest.approx(total, rel=1e-3)


def test_discovered_chain_without_hosts_and_missing_topology(tmp_path):
    """A discovered path (run --dsn / attach) names hops as hop.<name> and may carry no hosts; a run directory
    without topology.json still gets a diagram, inferred from the stage names."""
    s = dnat()
    s["stages"].append({"name": "hop.socat", "leg": "request", "us_per_txn": 7.0})
    s["stages"].append({"name": "queued.socat", "leg": "response", "us_per_txn": 3.0})
    s["stages"].append({"name": "qdisc.pp-wire0", "leg": "request", "us_per_txn": 250.0})
    topo = {"chain": [{"process": "pgbench", "netns": None}, {"connects_to": "10.0.0.1:5432"},
                      {"hop": "hop.socat", "process": "socat", "pid": 4242, "netns": None},
                      {"process": "postgres", "pid": 17}]}
    m = path_model.build(s, topo)
    assert [p["id"] for p in m["processes"]] == ["pgbench", "socat", "docker-proxy", "backend"]
    socat = m["processes"][1]
    assert socat["pids"] == [4242] and socat["us"] == pytest.approx(10.0)
    svg = svg_path.render(m)
    p = parse(svg)
    assert {e["data-name"] for e in p.of("qdisc")} == {"qdisc.pp-wire0"}
    assert not p.of("host")                                    # no host known: no box, nothing invented
    m2 = path_model.build(s, None)
    assert m2["has_topology_json"] is False and "no topology.json" in svg_path.render(m2)
    # a stage the model cannot place stays visible, and the figures still add up
    s["stages"].append({"name": "mystery.thing", "leg": "request", "us_per_txn": 5.0})
    m3 = path_model.build(s, topo)
    assert "mystery.thing" in [u["name"] for u in m3["unplaced"]["request"]]
    assert "mystery.thing" in svg_path.render(m3)


def test_compare_diagrams_show_deltas(tmp_path):
    b, d = bridge(), dnat()
    doc = write_html([b, d], tmp_path / "c.html").read_text()
    assert doc.count('class="pp-path"') == 2
    second = doc[doc.index('data-run="docker-dnat'):]
    assert "Δ against docker-bridge" in second
    assert "not in the baseline" in second                                # docker-proxy is not in the baseline
    first = doc[: doc.index('data-run="docker-dnat')]
    be = [next(e for e in parse(part).of("process") if e["data-name"] == "backend") for part in (first, second)]
    delta = float(be[1]["data-us-per-txn"]) - float(be[0]["data-us-per-txn"])
    assert f"Δ {delta:+,.1f} µs vs baseline" in second


def test_waterfall_from_recorded_traces(tmp_path):
    traces = pd.read_parquet(RUNS / "pgbouncer-traces" / "traces.parquet")
    txns = waterfall.transactions(traces)
    assert txns
    for t in txns:   # complete and contiguous: every leg, each span starting where the previous ended
        assert {sp["leg"] for sp in t["spans"]} >= {"request", "server", "response", "client"}
        ends = [sp["start_ns"] + sp["dur_ns"] for sp in t["spans"][:-1]]
        assert ends == [sp["start_ns"] for sp in t["spans"][1:]]
        assert t["spans"][-1]["stage"] == "client.pgbench"
    picked = waterfall.pick(txns)
    durs = sorted(t["dur_ns"] for t in txns)
    assert picked["p50"]["dur_ns"] == durs[(len(durs) - 1) // 2] and picked["p99"]["dur_ns"] >= picked["p50"]["dur_ns"]
    s = summary_of("pgbouncer-traces")
    p = parse(write_html([s], tmp_path / "w.html").read_text())
    spans = p.of("span")
    assert {e["data-row"] for e in spans} == {"pgbench", "pgbouncer", "backend"}
    assert len(spans) == len(picked["p50"]["spans"]) + len(picked["p99"]["spans"])
    backend_rows = {e["data-stage"] for e in spans if e["data-row"] == "backend"}
    assert "backend.execute" in backend_rows


def test_waterfall_without_complete_transactions():
    """Recorded on a run whose sockets never sampled the same message: the most complete chains are drawn, and
    the page says they are partial."""
    traces = pd.read_parquet(RUNS.parent / "traces" / "pgbouncer-unaligned.parquet")
    assert waterfall.transactions(traces) == []
    chains = waterfall.partial_chains(traces)
    assert chains and all({sp["leg"] for sp in c["spans"]} == {"request", "server"} for c in chains)
    sec = waterfall.section(traces, ["pgbench", "pgbouncer", "backend"], {"pgbouncer"}, "x")
    p = parse(sec)
    assert "partial" in sec and {e["data-row"] for e in p.of("span")} == {"pgbouncer", "backend"}
    # lone spans (nothing chains): a sentence, no chart
    df = pd.DataFrame({"ts_ns": [0, 100], "dur_ns": [10, 15], "role": ["pgbench"] * 2,
                       "stage": ["wire.pgbench", "client.pgbench"], "leg": ["response", "client"]})
    assert waterfall.transactions(df) == [] and waterfall.partial_chains(df) == []
    assert "no chain" in waterfall.section(df, [], set(), "x")
    assert waterfall.section(None, [], set(), "x") == ""


def test_charts_legend_is_causes_and_tables_sort(tmp_path):
    s = summary_of("docker-dnat")
    doc = write_html([s], tmp_path / "r.html").read_text()
    legend = doc[doc.index('class="legend"'):]
    legend = legend[: legend.index("</p>")]
    assert legend.count("<span>") <= 12                         # causes, not 40 stages
    assert "hop docker-proxy" in legend and "netfilter" in legend
    p = parse(doc)
    assert sum(1 for t in p.tables if t.get("class") == "sortable") >= 2
    assert "aria-sort" in doc and "data-ready" in doc            # the sorting script is inline


def test_kernel_stages_land_on_the_segment_that_carries_them():
    """A guest behind a tap (kvm-tap's shape) and a container behind a veth: the tap's time is between pgbench
    and qemu on the host, a veth's on the segment that crosses into the container, a receiver-side hook on the
    segment into the namespace that has it."""
    s = {**dnat(), "cpu": []}
    s["stages"] = [{"name": n, "leg": leg, "us_per_txn": 1.0} for n, leg in (
        ("wire.qemu", "request"), ("dev.pp-kvm-tap0", "request"), ("hop.qemu", "server"),
        ("dev.pp-kvm-tap0", "response"), ("wire.pgbench", "response"))]
    topo = {"chain": [{"process": "pgbench", "host": "host", "netns": "pp-kvm"},
                      {"hop": "qemu", "host": "host", "netns": "pp-kvm", "pids": [9]},
                      {"process": "postgres", "host": "guest", "netns": None}],
            "hosts": {"host": {"netns": "pp-kvm", "addresses": []}, "guest": {"netns": None, "addresses": []}}}
    spec = {"bridges": [{"name": "pp-kvmbr0", "host": "host"}],
            "links": [{"kind": "tap", "a": {"bridge": "pp-kvmbr0", "ifname": "pp-kvm-tap0"}}]}
    m = path_model.build(s, topo, spec)
    where = {(e["name"], leg): (seg["from"], seg["to"]) for leg, segs in m["legs"].items() for seg in segs
             for e in seg["elements"]}
    assert where[("dev.pp-kvm-tap0", "request")] == ("pgbench", "qemu")
    assert where[("dev.pp-kvm-tap0", "response")] == ("qemu", "pgbench")
    assert where[("dev.pp-kvmbr0", "request")] == ("qemu", "backend")      # declared, not timed: drawn greyed
    qemu = m["processes"][1]
    assert qemu["own_us"] == 1.0 and qemu["stages"][0]["leg"] == "server"

    s["stages"] = [{"name": n, "leg": leg, "us_per_txn": 1.0} for n, leg in (
        ("dev.lo", "request"), ("dev.pp-veth0", "request"), ("netfilter.prerouting.pp-ctr", "request"),
        ("netfilter.output.pp-host", "request"), ("netfilter.forward.pp-host", "request"))]
    topo = {"chain": [{"process": "pgbench", "host": "host", "netns": "pp-host"},
                      {"hop": "hop.socat", "process": "socat", "host": "host", "netns": "pp-host"},
                      {"process": "postgres", "host": "ctr", "netns": "pp-ctr"}]}
    spec = {"links": [{"kind": "veth", "a": {"ifname": "pp-veth0", "host": "host"},
                       "b": {"ifname": "pp-eth0", "host": "ctr"}}]}
    m = path_model.build(s, topo, spec)
    where = {e["name"]: (seg["from"], seg["to"]) for seg in m["legs"]["request"] for e in seg["elements"]}
    assert where["dev.lo"] == ("pgbench", "socat")
    assert where["dev.pp-veth0"] == ("socat", "backend")
    assert where["netfilter.prerouting.pp-ctr"] == ("socat", "backend")
    assert where["netfilter.forward.pp-host"] == ("socat", "backend")
    assert where["netfilter.output.pp-host"] == ("pgbench", "socat")            # first of two candidates
    assert where["dev.pp-eth0"] == ("socat", "backend")


def test_a_run_without_probes_draws_the_shape_only(tmp_path):
    s = summary_of("docker-dnat")
    s["stages"], s["cpu"] = [], []
    p = parse(write_html([s], tmp_path / "off.html").read_text())
    procs = p.of("process")
    assert [e["data-name"] for e in procs] == ["pgbench", "docker-proxy", "backend"]
    assert all(e["data-us-per-txn"] == "" and e["data-cpu-us-per-txn"] == "" for e in procs)
    assert {e["data-us-per-txn"] for e in p.of("device")} == {""}       # declared by the spec, none timed
    assert "--probes off" in (tmp_path / "off.html").read_text()


def test_repeat_spread_in_compare_and_sweep(tmp_path):
    from fixtures_summaries import sweep_runs
    from pathprof.analysis.sweep import sweep_analysis
    b, d = bridge(), dnat()
    repeats = [[b, {**b, "tps": b["tps"] * 0.9}], [d, {**d, "tps": d["tps"] * 1.1}, {**d, "tps": d["tps"] * 0.95}]]
    doc = write_html([b, d], tmp_path / "c.html", repeats=repeats).read_text()
    assert "TPS spread of the repeats" in doc
    assert f"{b['tps'] * 0.9:,.0f} … {b['tps']:,.0f} (2 runs)" in doc
    assert f"{d['tps'] * 0.95:,.0f} … {d['tps'] * 1.1:,.0f} (3 runs)" in doc
    plain = write_html([b, d], tmp_path / "p.html")
    assert (tmp_path / "c-tps.png").read_bytes() != (tmp_path / "p-tps.png").read_bytes() and plain.exists()
    runs = sweep_runs()
    sw = sweep_analysis(runs)
    write_html(runs, tmp_path / "s0.html", sweep=sw)
    for p in sw["points"]:
        p.update(tps_min=p["tps"] * 0.9, tps_max=p["tps"] * 1.05, tps_runs=[p["tps"] * 0.9, p["tps"] * 1.05])
    write_html(runs, tmp_path / "s1.html", sweep=sw)
    assert (tmp_path / "s0-sweep.png").read_bytes() != (tmp_path / "s1-sweep.png").read_bytes()


def test_odd_topology_files_do_not_break_the_diagram(tmp_path):
    s = summary_of("docker-dnat")
    for broken in ('[1, 2]', '{"chain": "x", "hosts": "y"}', '{"chain": [null, 3, {"connects_to": "a"}], "hosts": []}',
                   "not json"):
        d = tmp_path / f"run{len(broken)}"
        shutil.copytree(RUNS / "docker-dnat", d)
        (d / "topology.json").write_text(broken)
        p = parse(write_html([{**s, "run_dir": str(d)}], d / "r.html").read_text())
        assert [e["data-name"] for e in p.of("process")] == ["pgbench", "docker-proxy", "backend"]
    # a chain naming a middle process without "hop" still makes it a hop
    m = path_model.build(s, {"chain": [{"process": "pgbench"}, {"process": "haproxy"}, {"process": "postgres"}]})
    assert [(p["id"], p["kind"]) for p in m["processes"]] == [
        ("pgbench", "client"), ("haproxy", "hop"), ("docker-proxy", "hop"), ("backend", "server")]


def test_link_delay_is_drawn_where_it_was_put(tmp_path):
    """A recorded cross-zone run (250 µs each way on the wire): each leg's delay line is a chip on the leg that
    carries it, the largest kernel element of the drawing; the waterfall shows it on the receiver's row."""
    s = summary_of("cross-zone")
    doc = write_html([s], tmp_path / "cz.html").read_text()
    p = parse(doc)
    delays = {(e["data-leg"], e["data-name"]): float(e["data-us-per-txn"]) for e in p.of("delay")}
    want = {(st["leg"], st["name"]): st["us_per_txn"] for st in s["stages"] if st["name"].startswith("delay.")}
    assert {leg for leg, _ in delays} == {"request", "response"} and delays == pytest.approx(want)
    chips = [float(e["data-us-per-txn"]) for e in p.found if e["data-element"] in ("wire", "device", "netfilter")]
    assert min(delays.values()) > max(chips)
    total = sum(st["us_per_txn"] for st in s["stages"] if not st.get("parent"))
    assert drawn_total(p) == pytest.approx(total, rel=1e-3)
    # traces carry no delay spans: the wire bars hold the delay, and the page says so
    wires = {e["data-row"]: float(e["data-dur-us"]) for e in p.of("span") if e["data-stage"].startswith("wire.")}
    assert set(wires) == {"backend", "pgbench"} and min(wires.values()) > 0.8 * min(delays.values())
    assert "each <code>wire.*</code> bar includes" in doc
    legend = doc[doc.index('class="legend"'):]
    assert "link impairment" in legend[: legend.index("</p>")]
