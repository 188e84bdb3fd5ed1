"""Builds a Topology into real namespaces, links, bridges, routes and iptables rules (pyroute2 + iptables).

Every object is journaled before it is created; `Journal.teardown()` removes exactly what was made.
"""
from __future__ import annotations

import ipaddress
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from pathprof.agent.host import iptables_batch, proc
from pathprof.agent.host.journal import Journal
from pathprof.agent.host.signal_zone import deferred_signals
from pathprof.errors import UserError
from pathprof.topologies import impairments as netem
from pathprof.topologies.spec import Topology
from pyroute2 import IPRoute, NetNS
from pyroute2 import config as pr_config
from pyroute2 import netns as pr_netns

# pyroute2 forks helper children (netns.create, NetNS) and stops them with SIGTERM. A child inherits our signal
# handlers; with the run's SIGTERM->KeyboardInterrupt handler the child would unwind through the *parent's*
# copied stack, run its `finally:` and tear the journal down (namespaces vanished mid-build). This flag makes
# the child reset SIGINT/SIGTERM to their defaults first thing.
pr_config.disable_mp_signal = True


@dataclass
class HostInfo:
    name: str
    netns: str | None
    addresses: list[str] = field(default_factory=list)


@dataclass
class PostgresEndpoint:
    host: str
    address: str | None          # None for a unix socket
    port: int
    socket_dir: str | None
    user: str = "postgres"
    dbname: str = "postgres"


@dataclass
class BuildContext:
    """What services and the run need to know about a built topology."""
    topology: Topology
    journal: Journal
    state_dir: Path
    hosts: dict[str, HostInfo]
    postgres: PostgresEndpoint | None = None
    clients: int = 1             # pgbench clients: poolers size their pools and children from it

    def host(self, name: str) -> HostInfo:
        return self.hosts[name]

    def spawn(self, host: str, argv: list[str], **kw) -> subprocess.Popen:
        return self.journal.spawn(self.hosts[host].netns, argv, **kw)

    def run(self, host: str, argv: list[str], **kw) -> subprocess.CompletedProcess:
        return proc.run(self.hosts[host].netns, argv, **kw)


@contextmanager
def _ipr(netns: str | None):
    """pyroute2's handle on a namespace (None: ours); a Ctrl-C inside waits for the block's end (signal_zone)."""
    with deferred_signals(), (NetNS(netns) if netns else IPRoute()) as ipr:
        yield ipr


def _link_exists(netns: str | None, ifname: str) -> bool:
    if netns and not Path(f"/run/netns/{netns}").exists():
        return False
    with _ipr(netns) as ipr:
        return bool(ipr.link_lookup(ifname=ifname))


def check_free(topo: Topology) -> None:
    """Refuse before creating anything if a name the spec uses is already taken."""
    hint = "(another pathprof run is using it, or a killed run left it: run `pathprof cleanup`)"
    for h in topo.hosts.values():
        if h.netns and Path(f"/run/netns/{h.netns}").exists():
            raise UserError(f"network namespace {h.netns} already exists {hint}")
    names = [b.name for b in topo.bridges]
    for link in topo.links:
        names += [e.ifname for e in (link.a, link.b) if e is not None]
    for n in names:
        if _link_exists(None, n):
            raise UserError(f"network interface {n} already exists {hint}")


def build(topo: Topology, journal: Journal, state_dir: Path, progress: Callable[[str], None] = lambda s: None
          ) -> BuildContext:
    check_free(topo)
    for tool in ("ip", "iptables", "iptables-restore"):
        proc.which(tool)
    hosts = {h.name: HostInfo(h.name, h.netns) for h in topo.hosts.values()}
    for h in topo.hosts.values():
        if h.netns:
            progress(f"namespace {h.netns}")
            journal.record("netns", name=h.netns)
            pr_netns.create(h.netns)
            with _ipr(h.netns) as ns:
                ns.link("set", index=ns.link_lookup(ifname="lo")[0], state="up")
    bridge_ns = {}
    for b in topo.bridges:
        netns = topo.netns_of(b.host)
        bridge_ns[b.name] = netns
        progress(f"bridge {b.name}")
        journal.record("link", name=b.name, netns=netns)
        with _ipr(netns) as ipr:
            ipr.link("add", ifname=b.name, kind="bridge")
            idx = ipr.link_lookup(ifname=b.name)[0]
            if b.address:
                _addr(ipr, idx, b.address)
                hosts[b.host].addresses.append(b.address)
            ipr.link("set", index=idx, state="up")
    for link in topo.links:
        progress(f"{link.kind} {link.a.ifname}")
        if link.kind == "veth":
            _veth(topo, journal, link, bridge_ns, hosts)
        else:
            _tap(topo, journal, link, bridge_ns, hosts)
    _impair(topo, journal, bridge_ns, progress)
    # After links: per-interface sysctls (net.ipv4.conf.<bridge>.route_localnet) need the interface to exist.
    for h in topo.hosts.values():
        for key, value in h.sysctls.items():
            _sysctl(journal, h.netns, key, value)
    for r in topo.routes:
        with _ipr(topo.netns_of(r.host)) as ipr:
            dst = {} if r.dst == "default" else {"dst": r.dst}
            ipr.route("add", gateway=r.via, **dst)
    apply_iptables(topo, journal, progress)
    return BuildContext(topo, journal, state_dir, hosts)


def iptables_batches(topo: Topology) -> list[iptables_batch.Batch]:
    """The spec's chains and rules, one batch per (namespace, table), rules in the spec's order."""
    batches: dict[tuple, iptables_batch.Batch] = {}

    def batch(host: str, table: str) -> iptables_batch.Batch:
        netns = topo.netns_of(host)
        return batches.setdefault((netns, table), iptables_batch.Batch(netns, table))
    for c in topo.chains:
        b = batch(c.host, c.table)
        b.chains.append(c.name)
        b.chain_labels.append(f"{topo.source}: {c.key or 'chain ' + c.name}")
    for r in topo.rules:
        batch(r.host, r.table).rules.append(iptables_batch.BatchRule(r.chain, r.args, r.position,
                                                                     f"{topo.source}: {r.key or 'rule'}"))
    return list(batches.values())


def apply_iptables(topo: Topology, journal: Journal, progress: Callable[[str], None] = lambda s: None) -> None:
    """Each batch journaled (what removal needs), then applied with one iptables-restore."""
    batches = iptables_batches(topo)
    if not batches:
        return
    tools = iptables_batch.backend()
    for b in batches:
        progress(f"iptables {b.table} in {b.netns or 'the root namespace'}: {len(b.chains)} chains, "
                 f"{len(b.rules)} rules")
        journal.record("iptables_batch", **iptables_batch.journal_fields(b, tools))
        iptables_batch.apply(b, tools, f"host namespace {b.netns}" if b.netns else "the root namespace")

def _impair(topo: Topology, journal: Journal, bridge_ns: dict, progress: Callable[[str], None]) -> None:
    """Link impairments (topologies.impairments), once every end is placed: rate qdiscs and delay lines."""
    if any(link.impairments() for link in topo.links):
        netem.impair(topo, journal, bridge_ns, progress)


def _sysctl(journal: Journal, netns: str | None, key: str, value: str) -> None:
    old = proc.run(netns, ["sysctl", "-n", key], check=False).stdout.strip() or None
    journal.record("sysctl", name=key, old=old, netns=netns)
    proc.run(netns, ["sysctl", "-q", "-w", f"{key}={value}"])


def _addr(ipr, idx: int, cidr: str) -> None:
    iface = ipaddress.ip_interface(cidr)
    ipr.addr("add", index=idx, address=str(iface.ip), prefixlen=iface.network.prefixlen)


def _place_end(topo: Topology, end, bridge_ns: dict, hosts: dict) -> None:
    """Move a link end from the root namespace into its host, or onto its bridge, address it, bring it up."""
    target_ns = bridge_ns[end.bridge] if end.bridge else topo.netns_of(end.host)
    if target_ns:
        with _ipr(None) as ipr:
            ipr.link("set", index=ipr.link_lookup(ifname=end.ifname)[0], net_ns_fd=target_ns)
    with _ipr(target_ns) as ipr:
        idx = _lookup(ipr, end.ifname)
        if end.bridge:
            ipr.link("set", index=idx, master=ipr.link_lookup(ifname=end.bridge)[0])
        if end.address:
            _addr(ipr, idx, end.address)
            if end.host:
                hosts[end.host].addresses.append(end.address)
        ipr.link("set", index=idx, state="up")


def _lookup(ipr, ifname: str, wait_s: float = 3.0) -> int:
    """Index of an interface that was just created or moved; the namespace may take a moment to show it."""
    deadline = time.monotonic() + wait_s
    while True:
        found = ipr.link_lookup(ifname=ifname)
        if found:
            return found[0]
        if time.monotonic() > deadline:
            raise UserError(f"interface {ifname} did not appear after it was created")
        time.sleep(0.05)


def _veth(topo: Topology, journal: Journal, link, bridge_ns: dict, hosts: dict) -> None:
    # Created in the root namespace, then moved: deleting either end later removes the pair.
    journal.record("link", name=link.a.ifname, netns=None)
    with _ipr(None) as ipr:
        ipr.link("add", ifname=link.a.ifname, kind="veth", peer={"ifname": link.b.ifname})
    for end in (link.a, link.b):
        ns = bridge_ns[end.bridge] if end.bridge else topo.netns_of(end.host)
        if ns:
            journal.record("link", name=end.ifname, netns=ns)
        _place_end(topo, end, bridge_ns, hosts)


def _tap(topo: Topology, journal: Journal, link, bridge_ns: dict, hosts: dict) -> None:
    end = link.a
    ns = bridge_ns[end.bridge] if end.bridge else topo.netns_of(end.host)
    journal.record("link", name=end.ifname, netns=ns)
    proc.run(ns, ["ip", "tuntap", "add", "dev", end.ifname, "mode", "tap"])
    with _ipr(ns) as ipr:
        idx = ipr.link_lookup(ifname=end.ifname)[0]
        if end.bridge:
            ipr.link("set", index=idx, master=ipr.link_lookup(ifname=end.bridge)[0])
        if end.address:
            _addr(ipr, idx, end.address)
        ipr.link("set", index=idx, state="up")


def port_in_use(netns: str | None, address: str, port: int) -> bool:
    """True if something already listens on address:port inside the namespace."""
    if netns and not Path(f"/run/netns/{netns}").exists():
        return False
    out = proc.run(netns, ["ss", "-Hltn", f"sport = :{port}"], check=False).stdout
    return bool(out.strip())

