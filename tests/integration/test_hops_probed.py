"""Each path's defining hop or rule shows up in what the probes measured (issue: every path, hop by hop)."""
import json

import pytest

from conftest import machine_state, run_pathprof

pytestmark = pytest.mark.integration


def _run(topology, runs_dir, *extra, clients="2", duration="3"):
    before = machine_state()
    cp = run_pathprof("run", "--topology", topology, "--clients", clients, "--duration", duration, "--json",
                      *extra, runs_dir=runs_dir, check=True, timeout=600)
    assert machine_state() == before
    doc = json.loads(cp.stdout)
    return doc, {s["name"] for s in doc["stages"]}, {c["component"] for c in doc["cpu"]}


def test_nic_wire_has_netfilter_and_veth(runs_dir):
    _, stages, _ = _run("nic", runs_dir)
    assert any(s.startswith("netfilter.") and "pp-nic" in s for s in stages), stages
    assert any(s.startswith("dev.pp-nic") for s in stages), stages


def test_docker_dnat_proxy_is_a_hop_in_both_views(runs_dir):
    doc, stages, cpu = _run("docker-dnat", runs_dir)
    assert "hop.docker-proxy" in stages, stages
    assert any(c.startswith("hop.docker-proxy") for c in cpu), cpu
    legs = {s["leg"] for s in doc["stages"] if s["name"] == "hop.docker-proxy"}
    assert legs == {"request", "response"}


def test_docker_dnat_without_proxy_goes_through_nat(runs_dir):
    doc, stages, cpu = _run("docker-dnat", runs_dir, "--userland-proxy", "off")
    assert not any("docker-proxy" in s for s in stages | cpu)
    assert any(s.startswith("netfilter.") and "pp-dk-host" in s for s in stages), stages
    assert any(s.startswith("dev.pp-dk") for s in stages), stages


@pytest.mark.parametrize("topology,hop", [("pgbouncer", "pgbouncer"), ("pgpool", "pgpool")])
def test_pooler_is_a_hop_in_both_views(topology, hop, runs_dir):
    doc, stages, cpu = _run(topology, runs_dir)
    assert f"hop.{hop}" in stages, stages
    assert any(c.startswith(f"hop.{hop}") for c in cpu), cpu
    assert not any(s.endswith(".pg_aux") for s in stages), "pooler's server connections are backends"


@pytest.mark.slow
def test_kvm_tap_shows_the_tap_and_qemu(runs_dir):
    doc, stages, cpu = _run("kvm-tap", runs_dir, duration="4")
    assert doc["accelerator"] in ("kvm", "tcg")
    assert any("pp-kvm-tap0" in s for s in stages), stages
    assert any(c.startswith("hop.qemu") for c in cpu), cpu
