"""The probes on a path pathprof did not build (`run --dsn`, `attach`): their configuration, the processes they
follow and topology.json, all from a discovered path (pathprof.agent.discovery.chain). Nothing on the user's system
is changed: the only objects are the BPF programs and links, which go away with the probe session."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pathprof.agent.discovery.chain import DiscoveredPath, describe
from pathprof.agent.discovery.sockets import SocketTable
from pathprof.agent.run import recorder


@dataclass
class ForeignServer:
    """A postmaster someone else started: what recorder.track_path needs of a server."""
    pid: int

    def postmaster_children(self) -> list[int]:
        try:
            return [int(p) for p in Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text().split()]
        except OSError:
            return []


@dataclass
class ForeignHop:
    """A forwarding process found on the path: what recorder.track_path needs of a hop."""
    hop: str
    role: str
    pid: int

    def pids(self) -> list[int]:
        return [self.pid]


def ns_labels(table: SocketTable, path: DiscoveredPath) -> dict:
    """Namespace reference -> the name the tables show: pathprof's own is "root", a named one keeps its name,
    an anonymous one (a container's) is named after the first process of the path living in it."""
    firsts: dict[int, str] = {}
    for pid in [*path.clients, *[h.pid for h in path.hops], *([path.postmaster] if path.postmaster else [])]:
        p = table.procs.get(pid)
        if p is not None:
            firsts.setdefault(p.netns, p.comm)
    out = {}
    for ns in path.namespaces:
        ref = table.ns_ref(ns)
        if ref and ref.startswith("/"):
            out[ref] = f"{firsts.get(ns, 'netns')}-ns"
    return out


def client_name(table: SocketTable, path: DiscoveredPath) -> str:
    """The name the client's stages go by (analysis.client): the comm of the client processes found."""
    from pathprof.analysis.client import name_of
    return name_of([table.procs[c].comm for c in path.clients if c in table.procs])


def probe_config(table: SocketTable, path: DiscoveredPath, level: str, trace_sample: int, window_s: float,
                 period_s: float, client: str = "pgbench"):
    from pathprof.agent.probing.session import ProbeConfig
    refs = list(dict.fromkeys(table.ns_ref(ns) for ns in path.namespaces)) or [None]
    binary = f"/proc/{path.postmaster}/exe" if path.postmaster else ""   # also right inside a container
    return ProbeConfig(level=level, netns=refs, service_ports=sorted(path.ports), postgres_bin=binary,
                       trace_sample=trace_sample, window_s=window_s, period_s=period_s,
                       hop_slots=len({h.name for h in path.hops}) + 1,
                       tap_hop=any(h.role == "qemu" for h in path.hops), netns_labels=ns_labels(table, path),
                       devices=len(refs) > 1 or any(h.role == "qemu" for h in path.hops), client=client)


def track(probes, path: DiscoveredPath, clients: bool = True) -> None:
    """Follow the server (backends and auxiliary processes by kind), each hop with its children, and the
    clients found in front of it (followed as the client role, `pgbench` in the raw tables: the report names it
    after the clients' program, run.json workload.client)."""
    server = ForeignServer(path.postmaster) if path.postmaster else None
    recorder.track_path(probes, server, [ForeignHop(h.name, h.role, h.pid) for h in path.hops])
    if clients:
        for pid in path.clients:
            if os.path.exists(f"/proc/{pid}"):
                probes.track(pid, "pgbench")


def topology_doc(table: SocketTable, path: DiscoveredPath, source: str) -> dict:
    """topology.json of a discovered path: the same `chain` shape as a built one, plus what could not be seen."""
    labels = ns_labels(table, path)
    hosts = {}
    for ns in path.namespaces:
        ref = table.ns_ref(ns)
        hosts[labels.get(ref, ref or "root")] = {"netns": ref, "addresses": []}
    return {"topology": "discovered", "source": source, "chain": describe(table, path), "hosts": hosts,
            "client_connections": path.client_connections, "unseen": path.unseen, "sockets": {}}


def summary_lines(table: SocketTable, path: DiscoveredPath) -> list[str]:
    """The discovered chain in words, for the phase line and the notes."""
    parts = []
    if path.clients:
        comms = sorted({table.procs[c].comm for c in path.clients if c in table.procs})
        parts.append(f"{'/'.join(comms) or 'clients'} ({path.client_connections} connections)")
    parts += [f"{h.comm} [{h.role}, pid {h.pid}]" for h in path.hops]
    if path.postmaster:
        parts.append(f"postgres [pid {path.postmaster}]")
    lines = [" -> ".join(parts)] if parts else []
    return lines + [f"not seen: {u}" for u in path.unseen]
