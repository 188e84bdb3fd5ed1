"""Link impairments on a real path: 200 µs each way on the nic wire, against the same path unimpaired.

Ground truth is the configured delay: it must raise the transaction cycle by about the round trip, and land in
the delay.<dev> stage of the leg that carries it (not in the wire); one direction only moves only its leg. Then
bad impairments are refused in one line, and nothing (namespaces, links, delay lines, rules) is left behind.
Figures are loose on purpose: the machine is shared and the delay line's wakeups add a little to each hold."""
import json
import subprocess
import time
from pathlib import Path

import pytest
from conftest import machine_state, run_pathprof

pytestmark = pytest.mark.integration

DELAY_US = 200


def nic_run(runs_dir, *extra) -> dict:
    args = ["run", "-t", "nic", "-c", "1", "-T", "2", "--probe-duty", "100", "--json", "--no-live", *extra]
    for _ in range(4):         # the built-in's namespaces are fixed: another run of nic may hold them
        cp = run_pathprof(*args, runs_dir=runs_dir)
        if cp.returncode == 0:
            return json.loads(cp.stdout)
        if "already exists" not in cp.stderr:
            break
        time.sleep(30)
    raise AssertionError(f"pathprof {' '.join(args)} exited {cp.returncode}:\n{cp.stderr[-3000:]}")


def stage(run: dict, name: str, leg: str) -> dict | None:
    return next((s for s in run["stages"] if s["name"] == name and s["leg"] == leg), None)


def leg_p50_us(run: dict, leg: str) -> float:
    """A leg's typical time: each stage's median occurrence times its occurrences per transaction (robust to the
    shared machine's occasional long run-queue waits, which move means)."""
    return sum((s["p50_us"] or 0) * s["count_per_txn"] for s in run["stages"] if s["leg"] == leg and "parent" not in s)


def delay_line_pids() -> list[str]:
    return subprocess.run(["pgrep", "-f", "probes/pp-delayline"], capture_output=True, text=True).stdout.split()


@pytest.fixture(scope="module")
def runs(tmp_path_factory, always_on_run):
    d = tmp_path_factory.mktemp("netem-runs")
    before = machine_state()
    # the unimpaired base: nic_run's settings, 3 s (tests/conftest.py, shared with other modules)
    out = {"base": always_on_run("nic", 1), "both": nic_run(d, "--link", f"wire:delay_us={DELAY_US}"),
           "request": nic_run(d, "--link", f"pp-nic-c:delay_us={DELAY_US}")}
    out["residue"] = (before, machine_state(), delay_line_pids())
    return out


def test_delay_each_way_raises_the_cycle_by_the_round_trip(runs):
    base, both = runs["base"], runs["both"]
    cycle_delta = both["closure"]["cycle_us"] - base["closure"]["cycle_us"]
    p50_delta = (both["latency_ms"]["p50"] - base["latency_ms"]["p50"]) * 1000
    assert 300 <= p50_delta <= 600, (p50_delta, base["latency_ms"], both["latency_ms"])
    assert 300 <= cycle_delta <= 900, cycle_delta     # means: a shared machine's run-queue spikes add to them
    assert abs(both["closure"]["latency_error_pct"]) < 10, both["closure"]


def test_the_delay_lands_in_the_delay_stage_of_each_leg_not_the_wire(runs):
    both = runs["both"]
    for name, leg, wire in (("delay.pp-nic-c", "request", "wire.backend"),
                            ("delay.pp-nic-s", "response", "wire.pgbench")):
        s = stage(both, name, leg)
        assert s, (name, [x["name"] for x in both["stages"]])
        assert 0.9 <= s["count_per_txn"] <= 1.2, s
        assert 0.75 * DELAY_US <= s["p50_us"] <= 1.5 * DELAY_US, s
        assert s["us_per_txn"] >= 0.75 * DELAY_US, s
        assert stage(both, wire, leg)["us_per_txn"] < 0.25 * DELAY_US     # carved out of the wire
    assert not any(s["name"].startswith(("delay.", "qdisc.")) for s in runs["base"]["stages"])


def test_one_direction_moves_only_its_leg(runs):
    base, req = runs["base"], runs["request"]
    assert stage(req, "delay.pp-nic-c", "request")
    assert not any(s["name"].startswith("delay.") for s in req["stages"] if s["leg"] != "request")
    request_delta = leg_p50_us(req, "request") - leg_p50_us(base, "request")
    response_delta = leg_p50_us(req, "response") - leg_p50_us(base, "response")
    assert request_delta >= 0.75 * DELAY_US, (request_delta, response_delta)
    assert abs(response_delta) < 0.25 * DELAY_US, (request_delta, response_delta)


def test_each_delay_line_records_its_cpu_and_packets_over_the_interval(runs):
    # the machine's cost of a delay line (agent.host.machine_costs), for `predict --link`: each direction's
    # daemon handed back at least one packet per transaction (its data) and at most four (ACKs, the probes'
    # windows), and spent CPU doing it; a run without delay lines records none
    both = runs["both"]
    lines = json.loads((Path(both["run_dir"]) / "run.json").read_text())["delay_lines"]
    assert len(lines) == 2, lines
    for ln in lines:
        assert both["transactions"] * 0.9 <= ln["packets"] <= both["transactions"] * 4, (ln, both["transactions"])
        assert ln["cpu_us"] > 0, ln
    assert "delay_lines" not in json.loads((Path(runs["base"]["run_dir"]) / "run.json").read_text())


def test_nothing_is_left_behind(runs):
    before, after, pids = runs["residue"]
    for what in ("netns", "links"):          # (loop devices and root iptables may be other runs' on a shared machine)
        assert after[what] == before[what], what
    assert pids == []
    for cmd in (["ip", "netns", "list"], ["ip", "-o", "link", "show"]):
        assert "pp-nic-" not in subprocess.run(cmd, capture_output=True, text=True).stdout


@pytest.mark.parametrize("link, words", [
    ("wire:delay_us=-50", ["--link wire.delay_us", "negative"]),
    ("wire:loss_pct=120", ["--link wire.loss_pct", "0..100"]),
    ("nowhere:delay_us=5", ["no link or interface named 'nowhere'", "links: wire"]),
])
def test_bad_impairment_is_one_line_and_builds_nothing(link, words, tmp_path):
    before = machine_state()
    cp = run_pathprof("run", "-t", "nic", "--probes", "off", "-T", "1", "--link", link, runs_dir=tmp_path)
    assert cp.returncode == 2 and "Traceback" not in cp.stderr, cp.stderr
    errors = [line for line in cp.stderr.splitlines() if line.startswith("pathprof: error:")]
    assert len(errors) == 1, cp.stderr
    for w in words:
        assert w in errors[0], errors[0]
    after = machine_state()
    assert (after["netns"], after["links"]) == (before["netns"], before["links"])
