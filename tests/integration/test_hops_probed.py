"""Each path's defining hop or rule shows up in what the probes measured (issue: every path, hop by hop)."""
import json
from pathlib import Path

import pytest
from conftest import machine_state, run_pathprof

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def _run(topology, runs_dir, *extra, clients="2", duration="2"):
    before = machine_state()
    cp = run_pathprof("run", "--topology", topology, "--clients", clients, "--duration", duration, "--json",
                      *extra, runs_dir=runs_dir, check=True, timeout=600)
    assert machine_state() == before
    doc = json.loads(cp.stdout)
    return doc, {s["name"] for s in doc["stages"]}, {c["component"] for c in doc["cpu"]}


def _hooks(doc) -> dict:
    meta = json.loads((Path(doc["run_dir"]) / "run.json").read_text())
    return meta["probes"]["cost"]["netfilter_hooks"]


def test_nic_wire_has_veth_and_no_brackets_without_rules(always_on_run):
    doc = always_on_run("nic", 1)           # tests/conftest.py: shared with test_netem and test_foreign_load
    stages = {s["name"] for s in doc["stages"]}
    assert any(s.startswith("dev.pp-nic") for s in stages), stages
    # no rules, no conntrack in either namespace: nothing runs on their hooks, so nothing is bracketed
    assert _hooks(doc) == {"pp-nic-cli": [], "pp-nic-srv": []}
    assert not any(s.startswith("netfilter.") for s in stages), stages


def test_injected_rules_get_brackets_on_their_hook_only(runs_dir, tmp_path):
    """Ground truth: 300 non-matching filter rules on the server's INPUT hook (a known cost the spec adds);
    the brackets go on that hook of that namespace only, and its stage appears on the request leg."""
    spec = (ROOT / "topologies" / "nic.toml").read_text().replace('name = "nic"', 'name = "nic-rules"')
    spec += '\n[[chains]]\nhost = "server"\ntable = "filter"\nname = "PP-TEST"\n'
    spec += '\n[[rules]]\nhost = "server"\ntable = "filter"\nchain = "INPUT"\nargs = ["-j", "PP-TEST"]\n'
    for i in range(300):
        spec += (f'\n[[rules]]\nhost = "server"\ntable = "filter"\nchain = "PP-TEST"\n'
                 f'args = ["-p", "udp", "--dport", "{10000 + i}", "-j", "DROP"]\n')
    path = tmp_path / "nic-rules.toml"
    path.write_text(spec)
    doc, stages, _ = _run(str(path), runs_dir)
    assert _hooks(doc) == {"pp-nic-cli": [], "pp-nic-srv": ["input"]}
    nf = [s for s in doc["stages"] if s["name"].startswith("netfilter.")]
    assert [(s["name"], s["leg"]) for s in nf] == [("netfilter.input.pp-nic-srv", "request")], nf
    assert nf[0]["us_per_txn"] > 0


# docker-dnat (proxy on and off), pgbouncer and pgpool as hops in both views: test_paths.py, on the same runs that
# look at each path from outside.


@pytest.mark.slow
def test_kvm_tap_shows_the_tap_and_qemu(runs_dir):
    """The one real guest boot of the suite (~25 s under TCG): the guest's whole life through a run — booted
    from the cached image under KVM or TCG (vhost only with KVM and /dev/vhost-net), served pgbench behind the
    tap, powered off cleanly on request at teardown (its console log, kept in the run directory, says so), the
    cached image left pristine, nothing left on the machine (_run compares the machine before and after)."""
    doc, stages, cpu = _run("kvm-tap", runs_dir, duration="3")
    assert doc["accelerator"] in ("kvm", "tcg")
    assert doc["tps"] > 0
    assert any("pp-kvm-tap0" in s for s in stages), stages
    assert any(c.startswith("hop.qemu") for c in cpu), cpu
    meta = json.loads((Path(doc["run_dir"]) / "run.json").read_text())
    (guest,) = [s for s in meta["services"] if "accelerator" in s]
    assert guest["accelerator"] == doc["accelerator"]
    assert guest["vhost"] == (guest["accelerator"] == "kvm" and Path("/dev/vhost-net").exists()), guest
    assert guest["boot_to_ready_s"] and guest["boot_to_ready_s"] > 0, guest
    console = Path(doc["run_dir"]) / "logs" / "console.log"
    assert "poweroff requested" in console.read_text(errors="replace"), console
    from pathprof.topologies.guest import GuestImage
    assert GuestImage().disk_path.exists()     # the snapshot overlay kept the cached image


def test_pooler_replies_in_pieces_are_counted_once(always_on_run):
    """pgpool forwards a reply to pgbench in several pieces; pgbench waits for the last one only, so only that
    piece's wakeup is on the path (the earlier ones overlap pgpool's work on the rest). Counting every piece
    over-counted the latency view by ~20 % here; now the view closes. (16 clients, always on: test_closure_pgpool's
    run, tests/conftest.py.)"""
    doc = always_on_run("pgpool", 16)
    meta = json.loads((Path(doc["run_dir"]) / "run.json").read_text())
    assert meta["probes"]["counters"]["piece_superseded"] > 0.5 * doc["transactions"] * 0.5
    assert abs(doc["closure"]["latency_error_pct"]) <= 10, doc["closure"]
