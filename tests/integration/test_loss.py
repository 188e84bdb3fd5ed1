"""Packet loss on a link (#22): the time a message waits for the TCP retransmission that delivers it is a stage
of its own on the leg where it happened (retx_<kind>.<receiver>), the view closes again under loss, the loss
stages carry the gap against the clean link, and the retransmissions the probes count match the kernel's own
counters in the path's namespaces. Ground truth: the same nic path, 2 % loss on its wire (pathprof's delay line)
against none; and the same loss between Docker's bridge and a container reached through its published port with
the userland proxy off, where DNAT and MASQUERADE rewrite the addresses and ports between the two ends of each
connection (the receiver's tuple is not the sender's: the pairing must hold on what NAT leaves alone); and 1 % loss
there with the userland proxy on (Docker's default), where the loss is on the proxy's second connection, proxy ->
container, and pgbench's own connection to the proxy is loopback: no loss and no delay on it, so its wires stay
as short as on a clean path (a delay line's hold once lent its send start to later loopback skbs, and a proxy
thread's stale forward stamp charged a recovery wait again as poolwait: +12.9 … +22.9 %)."""
import json

import premise
import pytest
from conftest import run_pathprof
from truth import record

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    # a clean run has tens of thousands of transactions a second: 1 s is plenty; a lossy one (~100 losses in 3 s at
    # 4 clients) stalls ~200 ms per loss, and at 2 s the stalls cut by the start and end weigh ±10 % or more
    cp = run_pathprof("compare", "nic:duration=1", *LOSSY, "--clients", "4", "--duration", "3", "--probe-duty", "100",
                      "--json", runs_dir=tmp_path_factory.mktemp("runs"), check=True, timeout=600)
    doc = json.loads(cp.stdout)
    assert [e["run"] for e in doc["explanations"]] == LOSSY
    return doc, doc["runs"][0], doc["runs"][1:]


# nic: no NAT; docker-dnat without its userland proxy: pgbench's 127.0.0.1 -> 127.0.0.1:49155 reaches the
# container's 198.18.0.2:5432 from 198.18.0.1 (DNAT, MASQUERADE), so no end sees the other's tuple
LOSSY = ["nic:link=wire:loss_pct=2", "docker-dnat:userland-proxy=off:link=container:loss_pct=2",
         "docker-dnat:link=container:loss_pct=1"]
PATHS = [0, 1, 2]
IDS = ["nic", "docker-dnat", "docker-proxy"]


def _premise(*runs):
    """Neither run stretched by the hypervisor after the premise's remakes (ci42d: 19 % stolen from the lossy
    docker-proxy run, 1,577 wires unpaired, closure -25 %): said as such, not as a missed closure or share."""
    premise.assert_not_stolen(*runs)


@pytest.mark.parametrize("which", PATHS, ids=IDS)
def test_loss_closes_and_the_wait_is_on_the_legs(compared, which):
    _, clean, lossy = compared
    lossy = lossy[which]
    _premise(clean, lossy)
    assert abs(clean["closure"]["latency_error_pct"]) <= 5, clean["closure"]
    assert abs(lossy["closure"]["latency_error_pct"]) <= 10, lossy["closure"]
    retx = {(s["name"], s["leg"]): s["us_per_txn"] for s in lossy["stages"] if s["name"].startswith("retx_")}
    legs = {leg for _, leg in retx}
    assert legs == {"request", "response"}, retx            # loss on both directions of the wire
    assert sum(retx.values()) > 0.5 * lossy["closure"]["cycle_us"], retx
    assert not [s for s in clean["stages"] if s["name"].startswith("retx_")]


@pytest.mark.parametrize("which", PATHS, ids=IDS)
def test_retransmissions_counted_as_the_kernel_counts_them(compared, which):
    _, clean, lossy = compared
    r = lossy[which]["tcp_retransmits"]
    kernel = r["kernel_retrans_segs"]
    assert kernel > 10, r
    assert abs(r["count"] - kernel) <= max(3, 0.15 * kernel), r
    assert {row["leg"] for row in r["by_leg"]} == {"request", "response"}
    assert r["wait_share_pct"] > 50, r
    # a clean link retransmits next to nothing: 3 tail-loss probes once beside the other lane (CI run 53; a loaded
    # CPU delays the ACKs past the probe timer) against ~10 times as many on the lossy link
    assert "tcp_retransmits" not in clean or clean["tcp_retransmits"]["count"] <= max(2, 0.1 * kernel), (
        clean["tcp_retransmits"], kernel)


@pytest.mark.parametrize("which", PATHS, ids=IDS)
def test_the_loss_carries_the_gap(compared, which):
    doc, clean, lossy = compared
    _premise(clean, lossy[which])
    expl = doc["explanations"][which]
    items = {i["name"]: i["delta_us_per_txn"] for i in expl["items"]}
    loss = sum(v for k, v in items.items() if k.startswith("retx_"))
    # the link's own stages: the loss is made by pathprof's delay line (topologies.netem), whose hold is
    # part of the impaired link (118 µs of a 4,985-µs gap on a quiet machine; a CPU-starved delay line holds
    # longer: an hour of 2-23 % steal gave a gap of 7,394 µs with 4,811 in retx_*, fresh-clone CI 2026-11-28)
    link = sum(v for k, v in items.items() if k.startswith("delay."))
    gap = expl["gap_us_per_txn"]
    record(f"loss share of the gap, {IDS[which]}", loss / gap if gap else None, ">= 0.7")
    record(f"loss and link share of the gap, {IDS[which]}", (loss + link) / gap if gap else None, ">= 0.7")
    top = sorted(items.items(), key=lambda kv: -abs(kv[1]))[:8]
    assert gap > 0 and loss + link >= 0.7 * gap, (gap, loss, link, expl.get("verdict"), top)
    top = max(expl["causes"], key=lambda c: abs(c["delta_us_per_txn"]))
    assert top["name"] == "packet loss", expl["causes"]


def test_a_loss_behind_docker_proxy_is_not_counted_again_on_its_loopback_side(compared):
    _, clean, lossy = compared
    lossy = lossy[2]
    st = {(s["name"], s["leg"]): s["us_per_txn"] for s in lossy["stages"]}
    # pgbench <-> docker-proxy is loopback: a few us of wire per transaction (the clean paths': below 10)
    for key in (("wire.pgbench", "response"), ("wire.docker-proxy", "request")):
        assert st.get(key, 0) < 25, (key, st.get(key))
    # the proxy forwards each request at once: it holds none (no poolwait), whatever the recovery waits behind it
    assert st.get(("poolwait.docker-proxy", "request"), 0) < 25, st
    # the loss is on the proxy's connection to the container, both ways: the backend's and the proxy's receives
    retx = {k: v for k, v in st.items() if k[0].startswith("retx_")}
    assert {k[0].split(".", 1)[1] for k in retx} == {"backend", "docker-proxy"}, retx
