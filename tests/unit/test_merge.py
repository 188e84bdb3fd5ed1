"""pathprof merge on constructed hosts' runs (real run directories written from tables whose answer is known):
connections matched through NAT, messages by TCP sequence number, the clock offset recovered from a shift,
wire stages never negative, the merged run closing against the client's cycle, and one-line refusals."""
import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from pathprof.analysis.merge import hist_of, merge, parse_drift, parse_shift
from pathprof.analysis.rundir import SCHEMA, RunDir
from pathprof.analysis.summary import summarize
from pathprof.errors import UserError

N = 2000                     # transactions each host saw
CLI, SRV = ("198.18.21.1", 40000), ("198.18.21.2", 5432)
PUBLISHED = ("198.18.21.2", 15432)     # the client dials the published port; DNAT on the server host


def _stage(kind, role, leg, us, count=N):
    return {"kind": kind, "role": role, "hop": "", "leg": leg, "hook": "", "netns": "", "dev": "", "count": count,
            "sum_ns": int(us * 1e3 * count), "hist": hist_of(np.full(5, us * 1e3), count / 5)}


def _msg(ts, d, role, leg, local, remote, seq):
    return {"ts_ns": int(ts), "dir": d, "role": role, "leg": leg, "txn": 0, "pid": 1, "tid": 1, "local_ip": local[0],
            "local_port": local[1], "remote_ip": remote[0], "remote_port": remote[1], "tcp_seq": int(seq)}


def _cpu(rows: dict) -> pd.DataFrame:
    """cpu.parquet rows from {(comp, role): µs per transaction} for N transactions."""
    return pd.DataFrame([{"comp": comp, "role": role, "hop": "", "where": "task" if comp == "softirq" else "",
                          "ns": int(us * 1e3 * N), "count": 0} for (comp, role), us in rows.items()])


def _host(root, name, stages, messages, conns, tps, cpu=None, machine="vm"):
    rd = RunDir.create(root, name)
    if cpu is not None:                    # (rows, busy µs per transaction)
        rd.write_frame("cpu.parquet", _cpu(cpu[0]))
        rd.update(cpu={"busy_ns": int(cpu[1] * 1e3 * N), "elapsed_ns": int(1e9), "ncpu": 2})
    rd.update(scope={"host": name, "netns": name, "hostname": machine, "whole_machine": False,
                     "leaving_connections": conns},
              host={"kernel": "6.18", "cpus": 2, "hostname": "vm", "os": "Debian 12"},
              workload={"clients": 1, "threads": None, "duration_s": 1.0, "mode": None, "script": "observed",
                        "connect": False, "scale": None, "rate": None}, topology={"name": "attach"},
              observed={"source": "probes", "tps": tps, "transactions": N, "latency_ms": {"mean": 0.02}})
    rd.write_frame("stages.parquet", pd.DataFrame(stages))
    rd.write_frame("messages.parquet", pd.DataFrame(messages))
    rd.write_json("topology.json", {"chain": [], "unseen": []})
    return rd.path


def two_runs(root, theta_ns=0.0, up_us=6.0, down_us=5.0, ppm=0.0, step_ns=50e3, cpu=(None, None),
             machines=("vm", "vm")):
    """A client host and a server host (its clock theta_ns ahead at the first message, running ppm fast) of one
    connection through DNAT: 1 client, cycle = 10 + (2+3+1) response + (2+1) request + 5 server + the two
    wires. The sampled exchanges start step_ns apart."""
    rng = np.random.default_rng(3)
    cli_msgs, srv_msgs = [], []
    t0 = t = 1e9
    for i in range(400):                                  # the sampled messages
        q = 1000 + 60 * i
        jit_up, jit_dn = rng.uniform(0, 1000, 2)
        srv_clock = lambda x: x + theta_ns + ppm * 1e-6 * (x - t0)    # noqa: E731
        cli_msgs.append(_msg(t, "send", "pgbench", "request", CLI, PUBLISHED, q))
        srv_msgs.append(_msg(srv_clock(t + up_us * 1e3 + jit_up), "recv", "backend", "request", SRV, CLI, q))
        r = 9000 + 70 * i
        srv_msgs.append(_msg(srv_clock(t + 20e3), "send", "backend", "response", SRV, CLI, r))
        cli_msgs.append(_msg(t + 20e3 + down_us * 1e3 + jit_dn, "recv", "pgbench", "response", CLI, PUBLISHED, r))
        t += step_ns
    cycle_us = 10 + 6 + 3 + 5 + up_us + 0.5 + down_us + 0.5
    c = _host(root, "cli", [_stage("proc", "pgbench", "client", 10), _stage("wakeup", "pgbench", "response", 2),
                            _stage("runqueue", "pgbench", "response", 3), _stage("recv", "pgbench", "response", 1),
                            _stage("wire", "pgbench", "response", 0.2, count=3)],
              cli_msgs, [{"side": "client", "pid": 1, "local": "198.18.21.1:40000", "remote": "198.18.21.2:15432",
                          "wire_local": "198.18.21.1:40000", "wire_remote": "198.18.21.2:15432", "nat": False}],
              1e6 / cycle_us, cpu[0], machines[0])
    s = _host(root, "srv", [_stage("wakeup", "backend", "request", 2), _stage("recv", "backend", "request", 1),
                            _stage("proc", "backend", "server", 5)],
              srv_msgs, [{"side": "server", "pid": 2, "local": "198.18.21.2:5432", "remote": "198.18.21.1:40000",
                          "wire_local": "198.18.21.2:15432", "wire_remote": "198.18.21.1:40000", "nat": True}],
              1e6 / cycle_us, cpu[1], machines[1])
    return c, s, cycle_us


@pytest.mark.parametrize("theta_ms", [-50.0, 0.0, 0.7, 50.0])
def test_merge_recovers_the_offset_places_the_wire_and_closes(tmp_path, theta_ms):
    c, s, cycle = two_runs(tmp_path, theta_ms * 1e6)
    rd = merge([s, c], tmp_path / "m", tmp_path)         # any order: the client host comes first
    d = summarize(RunDir.open(rd.path))
    (o,) = d["clock_offsets"]
    assert (o["host_a"], o["host_b"]) == ("cli", "srv")
    # asymmetric floors (6 vs 5 µs): the estimate is off by half the difference, and the bound covers it
    assert abs(o["offset_us"] - theta_ms * 1e3) <= o["bound_us"]
    assert o["bound_us"] == pytest.approx(5.5, abs=0.05)
    st = {(x["name"], x["leg"]): x["us_per_txn"] for x in d["stages"]}
    assert st[("wire.backend", "request")] > 0 and st[("wire.pgbench", "response")] > 0
    # the two wires add up to the true trips (6.5 + 5.5 µs mean); the offset's error moves time between them
    assert st[("wire.backend", "request")] + st[("wire.pgbench", "response")] == pytest.approx(12.0, abs=0.1)
    assert ("client.pgbench", "client") in st and ("backend.execute", "server") in st
    assert abs(d["closure"]["latency_error_pct"]) < 1.0 and d["closure"]["cycle_us"] == pytest.approx(cycle)
    wire = RunDir.open(rd.path).read_frame("wire.parquet")
    assert len(wire) == 800 and (wire["wire_ns"] >= 0).all()
    assert [h["name"] for h in d["hosts"]] == ["cli", "srv"]
    import jsonschema
    from pathprof.analysis.schemas import load
    jsonschema.validate(RunDir.open(rd.path).meta, load("run"))
    assert RunDir.open(rd.path).meta["schema"] == SCHEMA    # >= 1.1: merged keys


@pytest.mark.parametrize("ppm", [50.0, -50.0])
def test_a_drifting_clock_is_corrected(tmp_path, ppm):
    """The server's clock 50 ppm fast (or slow) over a 10 s run: θ moves 500 µs, a hundred times the bound. No
    constant offset fits (the fastest trips each way, at opposite ends of the run, contradict one another:
    merge refused these runs as a clock jump); with the drift applied the wires are the true trips again."""
    c, s, cycle = two_runs(tmp_path, 3e6, ppm=ppm, step_ns=25e6)
    d = summarize(merge([c, s], tmp_path / "m", tmp_path))
    (o,) = d["clock_offsets"]
    assert o["drift_applied"] and not o["constant_offset_fits"]
    assert o["drift_ppm"] == pytest.approx(ppm, abs=0.5)
    first, last = o["offset_span_us"]
    assert abs(first - 3000.0) <= o["bound_us"] and abs(last - (3000.0 + ppm * 9.975)) <= o["bound_us"]
    assert o["bound_us"] < 10
    st = {(x["name"], x["leg"]): x["us_per_txn"] for x in d["stages"]}
    # each wire within the bound of its true mean (6.5, 5.5 µs), and together exact
    assert abs(st[("wire.backend", "request")] - 6.5) <= o["bound_us"]
    assert abs(st[("wire.pgbench", "response")] - 5.5) <= o["bound_us"]
    assert st[("wire.backend", "request")] + st[("wire.pgbench", "response")] == pytest.approx(12.0, abs=0.1)
    wire = RunDir.open(d["run_dir"]).read_frame("wire.parquet")
    assert (wire["wire_ns"] >= 0).all() and wire["wire_ns"].max() < 8000
    assert abs(d["closure"]["latency_error_pct"]) < 1.0 and d["closure"]["cycle_us"] == pytest.approx(cycle)


def test_drift_injected_by_option_is_recovered(tmp_path):
    c, s, _ = two_runs(tmp_path, step_ns=25e6)
    o = summarize(merge([c, s], tmp_path / "a", tmp_path, drifts=parse_drift(["srv=-50"])))["clock_offsets"][0]
    assert o["drift_applied"] and o["drift_ppm"] == pytest.approx(-50.0, abs=0.5)
    plain = summarize(merge([c, s], tmp_path / "b", tmp_path))["clock_offsets"][0]
    assert not plain["drift_applied"] and plain["constant_offset_fits"] and "offset_span_us" not in plain
    for bad in (["srv"], ["srv=fast"], ["srv=1e6"]):
        with pytest.raises(UserError, match="HOST=PPM"):
            parse_drift(bad)
    with pytest.raises(UserError, match="--drift names no host"):
        merge([c, s], None, tmp_path, drifts={"nope": 1.0})


ONE_MACHINE = (   # namespaces of one kernel: each agent sees the machine's softirq and busy time, and the other's
    # processes in its `other` (pgbench 10 µs, backend 5 µs, softirq 3 µs, 1 µs of a foreign process: busy 19)
    ({("user", "pgbench"): 10.0, ("softirq", ""): 3.0, ("other", ""): 6.0}, 19.0),
    ({("user", "backend"): 5.0, ("softirq", ""): 3.0, ("other", ""): 11.0}, 19.0))
TWO_MACHINES = (
    ({("user", "pgbench"): 10.0, ("softirq", ""): 2.0, ("other", ""): 1.0}, 13.0),
    ({("user", "backend"): 5.0, ("sys", "backend"): 1.0, ("softirq", ""): 3.0, ("other", ""): 2.0}, 11.0))


@pytest.mark.parametrize("cpu, machines, want", [
    (ONE_MACHINE, ("vm", "vm"), {"pgbench.user": (10.0, "cli"), "backend.user": (5.0, "srv"),
                                 "softirq.net": (3.0, "vm"), "other": (1.0, "vm")}),
    (TWO_MACHINES, ("vm1", "vm2"), {"pgbench.user": (10.0, "cli"), "backend.user": (5.0, "srv"),
                                    "backend.sys": (1.0, "srv"), "softirq.net@cli": (2.0, "cli"),
                                    "softirq.net@srv": (3.0, "srv"), "other": (3.0, "cli+srv")})])
def test_the_merged_run_has_every_hosts_cpu_named_with_its_host(tmp_path, cpu, machines, want):
    """Each host's own processes side by side with their host; the kernel's work (softirq, untracked tasks)
    once per machine: hosts that are namespaces of one machine do not count it twice, and its `other` loses
    the processes the other agent tracked. The components close against the machines' busy time."""
    c, s, _ = two_runs(tmp_path, cpu=cpu, machines=machines)
    d = summarize(merge([c, s], tmp_path / "m", tmp_path))
    got = {x["component"]: (x["us_per_txn"], x["host"]) for x in d["cpu"]}
    assert got == want
    assert d["closure"]["cpu_error_pct"] == pytest.approx(0.0, abs=0.01)
    meta = RunDir.open(d["run_dir"]).meta
    assert meta["cpu"]["ncpu"] == 2 * len(set(machines))
    assert not any("see each host's own run" in x for x in d["notes"])
    from pathprof.analysis.report.run_view import cpu_table
    from pathprof.analysis.report.text import render_to_string
    text = render_to_string(cpu_table(d))
    for name, (_, host) in want.items():
        assert name in text and host in text


def test_report_and_diff_read_a_merged_runs_two_views(tmp_path):
    c, s, _ = two_runs(tmp_path, cpu=ONE_MACHINE)
    m = tmp_path / "m"
    merge([c, s], m, tmp_path)
    pp = [sys.executable, "-m", "pathprof.agent.cli.main"]
    rep = subprocess.run([*pp, "report", str(m)], capture_output=True, text=True)
    assert rep.returncode == 0, rep.stderr
    assert "CPU view" in rep.stdout and "backend.user" in rep.stdout and "wire.backend" in rep.stdout
    diff = subprocess.run([*pp, "diff", str(c), str(m), "--json"], capture_output=True, text=True)
    assert diff.returncode == 0, diff.stderr
    html = tmp_path / "r.html"
    assert subprocess.run([*pp, "report", str(m), str(c), "--html", str(html)], capture_output=True).returncode == 0
    assert "backend.user" in html.read_text()


def test_a_host_without_a_cpu_table_leaves_the_cpu_view_out_and_says_so(tmp_path):
    c, s, _ = two_runs(tmp_path, cpu=(ONE_MACHINE[0], None))
    d = summarize(merge([c, s], tmp_path / "m", tmp_path))
    assert d["cpu"] == [] and any("srv recorded no CPU table" in x for x in d["notes"])


def test_a_shift_moves_the_estimate_by_exactly_that(tmp_path):
    c, s, _ = two_runs(tmp_path)
    a = summarize(merge([c, s], tmp_path / "a", tmp_path))["clock_offsets"][0]
    b = summarize(merge([c, s], tmp_path / "b", tmp_path, parse_shift(["srv=-12345.5"])))["clock_offsets"][0]
    assert b["offset_us"] - a["offset_us"] == pytest.approx(-12345.5, abs=0.002)
    assert b["bound_us"] == a["bound_us"]


def test_refusals(tmp_path):
    c, s, _ = two_runs(tmp_path)
    with pytest.raises(UserError, match="same host cli"):
        merge([c, c], None, tmp_path)
    with pytest.raises(UserError, match="not a run directory"):
        merge([c, tmp_path], None, tmp_path)
    other = tmp_path / "o"
    other.mkdir()
    c2, s2, _ = two_runs(other)
    meta = json.loads((s2 / "run.json").read_text())
    meta["scope"]["host"] = "srv2"
    for conn in meta["scope"]["leaving_connections"]:
        conn["wire_remote"] = "198.18.21.9:40000"        # another client: nothing in common with cli
    (s2 / "run.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match="no common connections"):
        merge([c, s2], None, tmp_path)
    del meta["scope"]
    (s2 / "run.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match="no `scope`"):
        merge([c, s2], None, tmp_path)
    (s / "messages.parquet").unlink()
    with pytest.raises(UserError, match="--trace-sample"):
        merge([c, s], None, tmp_path)
    for bad in (["srv"], ["=5"], ["srv=x"]):
        with pytest.raises(UserError, match="HOST=MICROSECONDS"):
            parse_shift(bad)


def test_cli_errors_are_one_line(tmp_path):
    c, _, _ = two_runs(tmp_path)
    cp = subprocess.run([sys.executable, "-m", "pathprof.agent.cli.main", "merge", str(c), str(c)],
                        capture_output=True, text=True)
    assert cp.returncode == 2 and cp.stderr.count("\n") == 1
    assert cp.stderr.startswith("pathprof: error: two runs of the same host cli")


def test_hist_of_matches_the_slot_bounds():
    from pathprof.analysis.histogram import slot_bounds
    for v in (0, 3, 4, 7, 8, 1000, 123_456, 2**31 + 5):
        i = int(np.flatnonzero(hist_of([v]))[0])
        lo, hi = slot_bounds(i)
        assert lo <= v < hi


def test_a_host_recording_beyond_the_common_interval_is_said():
    from types import SimpleNamespace

    from pathprof.analysis.merge_output import _outside_note, outside_common
    ident = lambda ts: np.asarray(ts, dtype=float)          # noqa: E731
    cli = SimpleNamespace(name="cli", messages=pd.DataFrame({"ts_ns": np.arange(0, 6_000, 10)}))   # 6 s
    srv = SimpleNamespace(name="srv", messages=pd.DataFrame({"ts_ns": np.arange(1_500, 4_500, 10)}))  # the middle 3
    out = outside_common([cli, srv], {"cli": ident, "srv": ident})
    assert out == {"cli": 50.0, "srv": 0.0}
    note = _outside_note(out)
    assert "cli recorded 50 %" in note and "srv" not in note
    assert _outside_note({"cli": 1.0, "srv": 0.0}) is None


@pytest.mark.parametrize("machines, rows", [(("vm", "vm"), 1), (("vm-a", "vm-b"), 2)])
def test_the_disk_is_counted_once_per_machine(tmp_path, machines, rows):
    """Block requests are every request the machine completed: hosts that are namespaces of one machine each
    recorded the same ones."""
    c, s, _ = two_runs(tmp_path, machines=machines)
    for path in (c, s):
        rd = RunDir.open(path)
        st = rd.read_frame("stages.parquet")
        block = {**_stage("block", "", "", 300.0, count=N // 100), "dev": "vda", "hook": "write"}
        rd.write_frame("stages.parquet", pd.concat([st, pd.DataFrame([block])], ignore_index=True))
    rd = merge([c, s], tmp_path / "m", tmp_path)
    disk = summarize(RunDir.open(rd.path))["disk"]
    assert len(disk) == rows and all(d["requests_per_txn"] == pytest.approx(0.01) for d in disk), disk


@pytest.mark.parametrize("boots, machines", [(("b1", "b1"), 1), (("b1", "b2"), 2)])
def test_machines_are_told_apart_by_boot_id_not_hostname(tmp_path, boots, machines):
    """Two VMs cloned from one image share a hostname (two kernel guests, bench/two_guests: both `pp-kern-guest`):
    their boot ids tell them apart, so each one's busy time and softirq count; namespaces of one kernel share
    their boot id and stay one machine."""
    c, s, _ = two_runs(tmp_path, cpu=ONE_MACHINE if machines == 1 else TWO_MACHINES, machines=("vm", "vm"))
    for path, boot in zip((c, s), boots):
        rd = RunDir.open(path)
        rd.update(scope={**rd.meta["scope"], "boot_id": boot})
    d = summarize(merge([c, s], tmp_path / "m", tmp_path))
    meta = RunDir.open(d["run_dir"]).meta
    assert meta["cpu"]["ncpu"] == 2 * machines
    assert len(meta["cpu"]["machines"]) == machines
    if machines == 2:
        assert sorted(meta["cpu"]["machines"]) == ["vm (boot b1)", "vm (boot b2)"]
    assert d["closure"]["cpu_error_pct"] == pytest.approx(0.0, abs=0.01)
