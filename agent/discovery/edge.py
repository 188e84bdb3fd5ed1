"""A machine's edge: the connections of a path that leave it, as the other machine sees them.

One agent per host records its own part of a path (`attach --netns NAME` makes one network namespace such a
host); `pathprof merge` joins the hosts' runs by the connections that cross from one to the other. This module
finds those connections in a socket table (pathprof.agent.discovery.sockets): every established TCP socket of
the path's processes whose other end no process here holds. For each it records the socket's own tuple and
the tuple on the wire beyond this machine's NAT, from the namespace's conntrack table (a connection this
machine opened leaves with the reply direction's destination as its source: SNAT/masquerade; one it
accepted arrives addressed to the original direction's destination: DNAT, a published port).
It also finds the clients of a server on another machine (`attach --remote ADDR:PORT`). Reading only.
"""
from __future__ import annotations

from pathprof.agent.discovery.chain import DiscoveredPath
from pathprof.agent.discovery.sockets import Addr, SocketTable
from pathprof.errors import UserError


def parse_addr(text: str) -> Addr:
    """ADDR:PORT (IPv4, or [IPv6]:PORT) -> Addr; a UserError naming the expected shape otherwise."""
    import ipaddress
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    try:
        ipaddress.ip_address(host)
        if not sep or not 0 < int(port) < 65536:
            raise ValueError
    except ValueError:
        raise UserError(f"--remote {text!r}: expected ADDR:PORT with a numeric address, e.g. 198.18.0.2:5432") from None
    return Addr(host, int(port))


def wire_tuple(conntrack: list, local: Addr, remote: Addr) -> tuple[Addr, Addr, bool]:
    """(local, remote) of a connection as seen on the wire beyond this machine's NAT, and whether NAT changed
    it. conntrack: parse_conntrack's (orig src, orig dst, reply src, reply dst) entries of this namespace."""
    for o_src, o_dst, r_src, r_dst in conntrack:
        if (o_src, o_dst) == (local, remote):          # we opened it: the reply comes back to r_dst from r_src
            w = (r_dst, r_src)
        elif (r_src, r_dst) == (local, remote):        # we accepted it: it was sent from o_src to o_dst
            w = (o_dst, o_src)
        else:
            continue
        return w[0], w[1], w != (local, remote)
    return local, remote, False


def leaving(t: SocketTable, pids: set[int]) -> list[dict]:
    """The established TCP connections of these processes whose other end is not on this machine: run.json
    `leaving_connections` [{side (client: we connected / server: we accepted), pid, local, remote, wire_local,
    wire_remote, nat}], addresses as "IP:PORT"."""
    listening = {(s.netns, s.local.port) for s in t.socks if s.kind == "tcp" and s.state == "listen"}
    out = []
    for s in t.held_by(pids):
        if s.kind != "tcp" or s.state != "established":
            continue
        other, _ = t.peer(s)
        if other is not None:
            continue
        wl, wr, nat = wire_tuple(t._conntrack(), s.local, s.remote)
        out.append({"side": "server" if (s.netns, s.local.port) in listening else "client", "pid": t.owner(s),
                    "local": str(s.local), "remote": str(s.remote), "wire_local": str(wl), "wire_remote": str(wr),
                    "nat": nat})
    return sorted(out, key=lambda c: (c["side"], c["local"], c["remote"]))


def path_pids(t: SocketTable, path: DiscoveredPath) -> set[int]:
    """Every process of a discovered path: clients, hops with their children, the server with its backends."""
    roots = [*path.clients, *[h.pid for h in path.hops], *([path.postmaster] if path.postmaster else [])]
    return set().union(*(t.descendants(p) for p in roots)) if roots else set()


def to_remote(t: SocketTable, remote: Addr) -> DiscoveredPath:
    """The clients of a server on another machine: the processes here with a connection to `remote` (the
    address they dialled). The path is clients only; its far side is the other host's run."""
    conns = [s for s in t.socks if s.kind == "tcp" and s.state == "established" and s.remote == remote]
    owned = [(s, t.owner(s)) for s in conns if t.owner(s) is not None]
    if not owned:
        where = "in this namespace" if t.scope is not None else "on this machine"
        raise UserError(f"no process {where} has a connection to {remote} now: attach profiles traffic that is "
                        "already flowing (start the load first)")
    path = DiscoveredPath(clients=sorted({p for _, p in owned}), client_connections=len(owned),
                          namespaces=list(dict.fromkeys(s.netns for s, _ in owned)), ports={remote.port})
    path.unseen.append(f"the server at {remote} is on another machine: its side is that machine's run "
                       "(pathprof merge joins them)")
    return path


def scope_doc(t: SocketTable, netns: str | None, host_name: str | None) -> dict:
    """run.json `scope`: which "machine" this run is (a namespace standing for one, or the whole machine)."""
    import socket
    name = host_name or (netns.rsplit("/", 1)[-1] if netns else socket.gethostname())
    from pathprof.agent.host.machine import boot_id
    return {"host": name, "netns": netns, "hostname": socket.gethostname(), "boot_id": boot_id(),
            "whole_machine": netns is None}

