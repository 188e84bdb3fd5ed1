"""Path discovery: the processes a PostgreSQL connection passes through on this machine, hop by hop.

From a client socket (pathprof's own test connection for `run --dsn`), or from the listener a server or hop
answers on (`attach --port`), each connection is followed to the process holding its other end
(pathprof.agent.discovery.sockets: swapped 4-tuple, NAT through conntrack, else a listener). A process that is not
PostgreSQL is a hop: it and its children are followed, and so is the connection it opens onward, until a
PostgreSQL backend (whose parent is the postmaster), or a hop whose connections onward all leave the machine (its
server is another host's: `onward_remote`). What cannot be seen is said, and the rest still works.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from pathprof.agent.discovery.sockets import Addr, Sock, SocketTable
from pathprof.errors import UserError

MAX_HOPS = 6
# a hop's probe role by its command; anything else forwarding connections is "other"
HOP_ROLES = (("pgbouncer", "pooler"), ("pgpool", "pooler"), ("odyssey", "pooler"), ("pgcat", "pooler"),
             ("docker-proxy", "proxy"), ("socat", "proxy"), ("haproxy", "proxy"), ("envoy", "proxy"),
             ("nginx", "proxy"), ("qemu", "qemu"))


def hop_role(comm: str) -> str:
    return next((role for prefix, role in HOP_ROLES if comm.startswith(prefix)), "other")


@dataclass
class Hop:
    name: str          # the hop's name in the tables (its command: hop.socat, hop.pgbouncer, ...)
    comm: str
    role: str
    pid: int           # the group's topmost process: tracking it follows its children and threads
    netns: int
    listen: list[str]  # the addresses it answers on
    matched: str       # how the connection into it was matched (connection | nat | listener)


@dataclass
class DiscoveredPath:
    postmaster: int | None = None
    postgres_netns: int | None = None
    postgres_listen: list[str] = field(default_factory=list)
    hops: list[Hop] = field(default_factory=list)
    clients: list[int] = field(default_factory=list)     # client processes (attach), pgbench's pid (run --dsn)
    client_connections: int = 0
    namespaces: list[int] = field(default_factory=list)  # every namespace crossed, client side first
    ports: set[int] = field(default_factory=set)         # the ports requests arrive on (the probes' legs)
    unseen: list[str] = field(default_factory=list)      # what could not be followed, in words
    onward_remote: list[str] = field(default_factory=list)  # the last hop's server(s) on another machine


def is_postgres(t: SocketTable, pid: int) -> bool:
    """A PostgreSQL server process (postmaster, backend, auxiliary): by its executable, whatever its title."""
    p = t.procs.get(pid)
    return bool(p) and (p.exe or p.comm) in ("postgres", "postmaster")


def postmaster_of(t: SocketTable, pid: int) -> int:
    """A backend's postmaster: its topmost postgres ancestor."""
    while pid in t.procs and is_postgres(t, t.procs[pid].ppid):
        pid = t.procs[pid].ppid
    return pid


def group_root(t: SocketTable, pid: int) -> int:
    """The topmost ancestor running the same command (pgpool's parent above the child that holds a socket)."""
    comm = t.procs[pid].comm if pid in t.procs else ""
    while pid in t.procs and t.procs.get(t.procs[pid].ppid) and t.procs[t.procs[pid].ppid].comm == comm:
        pid = t.procs[pid].ppid
    return pid


def _listen_addrs(t: SocketTable, pids: set[int]) -> tuple[list[str], set[int]]:
    socks = [s for s in t.held_by(pids) if s.state == "listen"]
    return ([str(s.local) if s.kind == "tcp" else f"unix:{s.path}" for s in socks],
            {s.local.port for s in socks if s.kind == "tcp"})


def _add_ns(path: DiscoveredPath, ns: int) -> None:
    if ns not in path.namespaces:
        path.namespaces.append(ns)


def follow(t: SocketTable, start: Sock, path: DiscoveredPath | None = None) -> DiscoveredPath:
    """Follow a connected client-side socket to the PostgreSQL server behind it, hop by hop."""
    path = path or DiscoveredPath()
    _add_ns(path, start.netns)
    s = start
    for _ in range(MAX_HOPS + 1):
        other, how = t.peer(s)
        if other is None:
            path.unseen.append(how)
            return path
        owner = t.owner(other)
        _add_ns(path, other.netns)
        if owner is None:
            path.unseen.append(f"the socket answering {s.remote} belongs to no process pathprof can read")
            return path
        if is_postgres(t, owner):
            pm = postmaster_of(t, owner)
            path.postmaster, path.postgres_netns = pm, t.procs[pm].netns
            path.postgres_listen, ports = _listen_addrs(t, {pm})
            path.ports |= ports
            return path
        root = group_root(t, owner)
        group = t.descendants(root)
        comm = t.procs[root].comm
        listen, ports = _listen_addrs(t, group)
        path.ports |= ports
        path.hops.append(Hop(comm, comm, hop_role(comm), root, t.procs[root].netns, listen, how))
        if hop_role(comm) == "qemu":
            path.unseen.append(f"{comm} (pid {root}) runs a virtual machine: the server inside the guest cannot be "
                               "seen from the host; the path is followed up to the guest's device")
            return path
        onward = [x for x in t.held_by(group) if x.state == "established" and
                  (x.kind == "unix" and not x.path or x.kind == "tcp" and x.local.port not in ports)]
        nxt = _first_resolving(t, onward)
        if nxt is None:
            _last_hop_here(t, path, onward, f"{comm} (pid {root})")
            return path
        s = nxt
    path.unseen.append(f"more than {MAX_HOPS} hops: stopped following")
    return path


def _last_hop_here(t: SocketTable, path: DiscoveredPath, onward: list[Sock], who: str) -> None:
    """A hop none of whose connections onward reaches a process here: its server is on another machine when
    they leave it (the hop is then the path's last one on this host; that host's run has the rest), else it
    has not connected yet."""
    away = sorted({str(s.remote) for s in onward if s.kind == "tcp" and t.peer(s)[0] is None})
    if not away:
        path.unseen.append(f"{who} has no open connection onward (not connected to its server yet)")
        return
    path.onward_remote = away
    # the onward port as dialled here: its packets on this host belong to the request/response legs
    path.ports |= {s.remote.port for s in onward if str(s.remote) in away}
    path.unseen.append(f"{who} connects onward to {', '.join(away)}, on another machine: the path on this host "
                       "ends there (that machine's own run has the rest; pathprof merge joins them)")


def _first_resolving(t: SocketTable, socks: list[Sock]) -> Sock | None:
    """The onward connection that reaches a process here (a pooler may also hold connections elsewhere)."""
    fallback = None
    for s in socks:
        other, _ = t.peer(s)
        if other is not None and t.owner(other) is not None:
            if is_postgres(t, t.owner(other)):
                return s
            fallback = fallback or s
    return fallback


def from_client_socket(inode: int, t: SocketTable | None = None) -> DiscoveredPath:
    """The path behind one of our own connected sockets (found by its inode)."""
    t = t or SocketTable.take()
    s = t.by_inode(inode)
    if s is None:
        raise UserError("path discovery: pathprof's own connection is not in the kernel's socket tables")
    return follow(t, s)


def from_port(port: int, t: SocketTable | None = None) -> tuple[DiscoveredPath, SocketTable]:
    """The server or hop answering on a TCP port (ours first, then any namespace), the path behind it, and the
    clients connected to it now."""
    t = t or SocketTable.take()
    lst = t.listeners(port)
    if not lst:
        raise UserError(f"nothing listens on port {port} in any network namespace of this machine")
    ours = [s for s in lst if s.netns == t.root_ns] or lst
    owners = {t.owner(s) for s in ours} - {None}
    if len(owners) != 1:
        raise UserError(f"port {port} is answered by {len(owners) or 'no readable'} processes in different "
                        "namespaces; pick one with --server-pid")
    return from_entry(t, owners.pop(), port), t


def from_server_pid(pid: int, t: SocketTable | None = None) -> tuple[DiscoveredPath, SocketTable]:
    t = t or SocketTable.take()
    if pid not in t.procs:
        if os.path.exists(f"/proc/{pid}"):
            raise UserError(f"process {pid} is not a PostgreSQL server pathprof can read (no network namespace "
                            "visible for it)")
        raise UserError(f"no process {pid}")
    if not is_postgres(t, pid):
        raise UserError(f"process {pid} ({t.procs[pid].comm}) is not a PostgreSQL server")
    pm = postmaster_of(t, pid)
    _, ports = _listen_addrs(t, {pm})
    path = from_entry(t, pm, min(ports) if ports else None)
    # A server's "clients" may be a forwarder's connections onward: then the path starts at that forwarder.
    for c in path.clients:
        root = group_root(t, c)
        fwd_ports = {s.local.port for s in t.held_by(t.descendants(root)) if s.kind == "tcp" and s.state == "listen"}
        if fwd_ports and not is_postgres(t, root):
            return from_entry(t, root, min(fwd_ports)), t
    return path, t


def from_entry(t: SocketTable, owner: int, port: int | None) -> DiscoveredPath:
    """Everything behind the process answering clients (forward), and the clients in front of it (back)."""
    path = DiscoveredPath()
    if is_postgres(t, owner):
        pm = postmaster_of(t, owner)
        path.postmaster, path.postgres_netns = pm, t.procs[pm].netns
        path.postgres_listen, path.ports = _listen_addrs(t, {pm})
        _add_ns(path, path.postgres_netns)
        entry = t.descendants(pm)
    else:
        root = group_root(t, owner)
        entry = t.descendants(root)
        incoming = [s for s in t.held_by(entry) if s.state == "established" and s.kind == "tcp"
                    and s.local.port == port]
        if not incoming:
            comm = t.procs[root].comm
            raise UserError(f"port {port} is answered by {comm} (pid {root}), which is not PostgreSQL, and no client "
                            "is connected through it now, so its path to a server cannot be followed (start the load "
                            "first, or name the server with --server-pid)")
        # Enter through one of its clients' connections: follow() then sees the hop and everything behind it.
        client_end, _ = t.peer(incoming[0])
        path = follow(t, client_end) if client_end is not None else _hop_only(t, root)
    _collect_clients(t, path, entry, port)
    return path


def _hop_only(t: SocketTable, root: int) -> DiscoveredPath:
    path = DiscoveredPath(unseen=["the hop's clients are not on this machine"])
    fake = next(s for s in t.held_by(t.descendants(root)) if s.kind == "tcp" and s.state == "listen")
    return follow(t, Sock(fake.netns, "tcp", "established", 0, Addr("0.0.0.0", 0), fake.local), path)


def _collect_clients(t: SocketTable, path: DiscoveredPath, entry: set[int], port: int | None) -> None:
    """The processes with a connection into the entry (clients of the first hop, or of the server)."""
    incoming = [s for s in t.held_by(entry) if s.state == "established" and
                (s.kind == "tcp" and s.local.port == port or s.kind == "unix" and s.path)]
    # the chain's own processes (hops with their children, the server) are not its clients
    chain_pids = set().union(*(t.descendants(h.pid) for h in path.hops)) | ({path.postmaster} if path.postmaster
                                                                            else set())
    clients, remote = set(), 0
    for s in incoming:
        other, _ = t.peer(s)
        pid = t.owner(other) if other is not None else None
        if pid is None:
            remote += 1
            continue
        if pid in chain_pids or is_postgres(t, pid):
            continue
        clients.add(pid)
        _add_ns(path, other.netns)
        path.client_connections += 1
    path.clients = sorted(clients)
    if remote:
        path.unseen.append(f"{remote} client connection(s) come from outside this machine: their client side is "
                           "not measured (the server side is)")
        path.client_connections += remote
    # client namespaces first, then the order the path crosses them
    path.namespaces.sort(key=lambda ns: 0 if any(t.procs[c].netns == ns for c in clients) else 1)


def describe(t: SocketTable, path: DiscoveredPath) -> list[dict]:
    """topology.json's chain (the shape of a built path's: client, hops, postgres)."""
    chain: list[dict] = []
    for c in path.clients:
        chain.append({"process": t.procs[c].comm if c in t.procs else "client", "pid": c, "role": "client",
                      "netns": t.ns_ref(t.procs[c].netns) if c in t.procs else None})
    for h in path.hops:
        chain.append({"hop": h.name, "process": h.comm, "pid": h.pid, "role": h.role, "netns": t.ns_ref(h.netns),
                      "listen": h.listen, "matched_by": h.matched})
    if path.postmaster:
        chain.append({"process": "postgres", "pid": path.postmaster, "netns": t.ns_ref(path.postgres_netns),
                      "listen": ", ".join(path.postgres_listen)})
    return chain
