"""Every socket on the machine, in every network namespace, with the processes that hold it.

A namespace's TCP table is /proc/PID/net/tcp{,6} read through any process inside it; a socket's owners are
the processes with a `socket:[INODE]` descriptor. Unix sockets come from `ss -xa` in each namespace (the
kernel's /proc table has no peer). Where NAT rewrote a connection, the namespace's conntrack table
(/proc/PID/net/nf_conntrack, else the conntrack tool) gives the tuple the other end sees. Reading only: nothing
here changes anything on the machine.
"""
from __future__ import annotations

import ipaddress
import os
import re
import struct
import subprocess
from dataclasses import dataclass, field

from pathprof.agent.discovery.ns_links import NamespaceLinks
from pathprof.agent.host.netns import netns_argv

TCP_STATES = {"01": "established", "0A": "listen"}


@dataclass(frozen=True)
class Addr:
    ip: str
    port: int

    def __str__(self) -> str:
        return f"[{self.ip}]:{self.port}" if ":" in self.ip else f"{self.ip}:{self.port}"

    @property
    def wildcard(self) -> bool:
        return self.ip in ("0.0.0.0", "::")


@dataclass
class Sock:
    netns: int                 # the namespace's inode
    kind: str                  # tcp | unix
    state: str                 # established | listen | other
    inode: int
    local: Addr | None = None  # tcp
    remote: Addr | None = None
    path: str = ""             # unix: the bound path, if any
    peer_inode: int = 0        # unix: the connected peer


@dataclass
class Proc:
    pid: int
    comm: str
    ppid: int
    netns: int
    exe: str = ""               # the executable's file name ("" where it cannot be read)


def _hex_addr(h: str) -> Addr:
    ip_hex, port_hex = h.split(":")
    if len(ip_hex) == 8:
        ip = str(ipaddress.IPv4Address(struct.pack("<I", int(ip_hex, 16))))
    else:
        raw = b"".join(struct.pack("<I", int(ip_hex[i:i + 8], 16)) for i in range(0, 32, 8))
        v6 = ipaddress.IPv6Address(raw)
        ip = str(v6.ipv4_mapped) if v6.ipv4_mapped else str(v6)
    return Addr(ip, int(port_hex, 16))


def parse_proc_tcp(text: str, netns: int) -> list[Sock]:
    """Rows of /proc/net/tcp or tcp6 (header skipped)."""
    out = []
    for line in text.splitlines()[1:]:
        f = line.split()
        if len(f) < 10:
            continue
        out.append(Sock(netns, "tcp", TCP_STATES.get(f[3], "other"), int(f[9]), _hex_addr(f[1]), _hex_addr(f[2])))
    return out


def parse_ss_unix(text: str, netns: int) -> list[Sock]:
    """`ss -Hxa` rows: Netid State Recv-Q Send-Q Local Inode Peer PeerInode."""
    out = []
    for line in text.splitlines():
        f = line.split()
        if len(f) < 8 or not f[0].startswith("u_"):
            continue
        state = {"ESTAB": "established", "LISTEN": "listen"}.get(f[1], "other")
        path = "" if f[4] == "*" else f[4]
        try:
            out.append(Sock(netns, "unix", state, int(f[5]), path=path, peer_inode=int(f[7]) if f[7].isdigit() else 0))
        except ValueError:
            continue
    return out


def parse_conntrack(text: str) -> list[tuple[Addr, Addr, Addr, Addr]]:
    """TCP entries of /proc/net/nf_conntrack or `conntrack -L`: (orig src, orig dst, reply src, reply dst)."""
    out = []
    for line in text.splitlines():
        if " tcp " not in f" {line} ":
            continue
        kv = re.findall(r"\b(src|dst|sport|dport)=(\S+)", line)
        if len(kv) < 8:
            continue
        o, r = dict(kv[:4]), dict(kv[4:8])
        try:
            out.append((Addr(o["src"], int(o["sport"])), Addr(o["dst"], int(o["dport"])),
                        Addr(r["src"], int(r["sport"])), Addr(r["dst"], int(r["dport"]))))
        except (KeyError, ValueError):
            continue
    return out


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _ns_ino(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


@dataclass
class SocketTable:
    """One look at the machine's processes and sockets."""
    procs: dict[int, Proc] = field(default_factory=dict)
    ns_pid: dict[int, int] = field(default_factory=dict)       # netns inode -> a process inside it
    socks: list[Sock] = field(default_factory=list)
    owners: dict[int, list[int]] = field(default_factory=dict)  # socket inode -> pids holding it
    root_ns: int = 0
    scope: int | None = None                                    # only this namespace (inode) was looked at
    _unix_read: bool = False
    _ct: list | None = None                                     # conntrack entries, read on first need
    _links: NamespaceLinks | None = None                        # namespaces joined by links, read on first need

    @classmethod
    def take(cls, only_netns: str | None = None) -> "SocketTable":
        """One look at the machine; with only_netns (a /run/netns name or a path), at that network namespace
        alone, as if it were the whole machine (`attach --netns`: one agent per "host"): processes and sockets
        elsewhere are not seen, so connections to them leave the "machine"."""
        t = cls._take()
        return t if only_netns is None else t.scoped(only_netns)

    def scoped(self, netns: str) -> "SocketTable":
        from pathprof.agent.host.netns import ns_path
        from pathprof.errors import UserError
        try:
            ino = os.stat(ns_path(netns)).st_ino
        except OSError:
            raise UserError(f"--netns {netns}: no such network namespace ({ns_path(netns)} does not exist)") from None
        if ino not in self.ns_pid:
            raise UserError(f"--netns {netns}: no process runs in that namespace")
        procs = {p: x for p, x in self.procs.items() if x.netns == ino}
        owners = {i: [p for p in ps if p in procs] for i, ps in self.owners.items()}
        return SocketTable(procs=procs, ns_pid={ino: self.ns_pid[ino]}, socks=[s for s in self.socks if s.netns == ino],
                           owners={i: ps for i, ps in owners.items() if ps}, root_ns=self.root_ns,
                           scope=ino)

    @classmethod
    def _take(cls) -> "SocketTable":
        t = cls(root_ns=_ns_ino(os.getpid()) or 0)   # "root": pathprof's own namespace
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            pid = int(name)
            stat = _read(f"/proc/{pid}/stat")
            ns = _ns_ino(pid)
            if not stat or ns is None:
                continue
            comm = stat[stat.find("(") + 1:stat.rfind(")")]
            ppid = int(stat[stat.rfind(")") + 2:].split()[1])
            try:
                exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
            except OSError:
                exe = ""
            t.procs[pid] = Proc(pid, comm, ppid, ns, exe)
            t.ns_pid.setdefault(ns, pid)
            try:
                fds = os.listdir(f"/proc/{pid}/fd")
            except OSError:
                continue
            for fd in fds:
                try:
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if link.startswith("socket:["):
                    t.owners.setdefault(int(link[8:-1]), []).append(pid)
        for ns in list(t.ns_pid):
            # through a process still in the namespace: the first one seen may have exited since (a busy machine)
            for pid in t.pids_in(ns):
                tables = [_read(f"/proc/{pid}/net/{f}") for f in ("tcp", "tcp6")]
                if tables[0] and _ns_ino(pid) == ns:
                    t.ns_pid[ns] = pid
                    t.socks += [x for text in tables for x in parse_proc_tcp(text, ns)]
                    break
        return t

    def pids_in(self, ns: int) -> list[int]:
        """The processes seen in a namespace, the one ns_pid names first."""
        first = self.ns_pid.get(ns)
        return ([first] if first is not None else []) + [p for p, x in self.procs.items() if x.netns == ns
                                                          and p != first]

    def anchor_namespaces(self, pids: list[int]) -> None:
        """Refer to each namespace through the first of these processes in it (a path's server and hops
        outlive the process first seen there, which may be a short-lived one: ns_ref's /proc/PID/ns/net)."""
        for pid in reversed(pids):
            p = self.procs.get(pid)
            if p is not None and p.netns in self.ns_pid and os.path.exists(f"/proc/{pid}"):
                self.ns_pid[p.netns] = pid

    # ---- lookups ----
    def ns_ref(self, ns: int) -> str | None:
        """A reference the rest of pathprof can enter: None (ours), a /run/netns name, or /proc/PID/ns/net."""
        if ns == self.root_ns:
            return None
        try:
            for name in sorted(os.listdir("/run/netns")):
                if os.stat(f"/run/netns/{name}").st_ino == ns:
                    return name
        except OSError:
            pass
        return f"/proc/{self.ns_pid[ns]}/ns/net"

    def cmdline(self, pid: int) -> str:
        return _read(f"/proc/{pid}/cmdline").replace("\0", " ").strip()

    def by_inode(self, inode: int) -> Sock | None:
        self._load_unix()
        return next((s for s in self.socks if s.inode == inode), None)

    def held_by(self, pids: set[int]) -> list[Sock]:
        self._load_unix()
        return [s for s in self.socks if pids & set(self.owners.get(s.inode, ()))]

    def listeners(self, port: int) -> list[Sock]:
        return [s for s in self.socks if s.kind == "tcp" and s.state == "listen" and s.local.port == port]

    def owner(self, sock: Sock) -> int | None:
        """The process holding a socket (the lowest pid: a forking server's parent before its children)."""
        pids = self.owners.get(sock.inode)
        return min(pids) if pids else None

    def descendants(self, pid: int) -> set[int]:
        out, todo = {pid}, [pid]
        while todo:
            p = todo.pop()
            for c in self.procs.values():
                if c.ppid == p and c.pid not in out:
                    out.add(c.pid)
                    todo.append(c.pid)
        return out

    def peer(self, s: Sock) -> tuple[Sock | None, str]:
        """The other end of a connected socket anywhere on the machine, and how it was matched
        (connection | nat | listener); (None, why) when no process here holds it."""
        if s.kind == "unix":
            p = self.by_inode(s.peer_inode) if s.peer_inode else None
            return (p, "connection") if p else (None, "no process on this machine holds the other end")
        same = [x for x in self.socks if x.kind == "tcp" and x.state == "established" and x.local == s.remote
                and x.remote == s.local]
        if same:
            return self._nearest(s, same)[0], "connection"
        for orig_src, orig_dst, rep_src, rep_dst in self._conntrack():
            # from the connecting side (original direction) to the answering one, or back (reply direction)
            if orig_src == s.local and orig_dst == s.remote:
                want = (rep_src, rep_dst)
            elif rep_src == s.local and rep_dst == s.remote:
                want = (orig_src, orig_dst)
            else:
                continue
            hit = [x for x in self.socks if x.kind == "tcp" and x.state == "established"
                   and (x.local, x.remote) == want]
            if hit:
                return self._nearest(s, hit)[0], "nat"
        lst = [x for x in self.listeners(s.remote.port) if x.local.ip == s.remote.ip or x.local.wildcard]
        if len({self.owner(x) for x in lst}) > 1:
            lst = [x for x in lst if self.links.joined(s.netns, x.netns)]
        if len({self.owner(x) for x in lst}) == 1:
            return lst[0], "listener"
        return None, (f"{s.remote} is not answered by any process pathprof can see (a server on another machine, "
                      "or a namespace without processes)")

    @property
    def links(self) -> NamespaceLinks:
        if self._links is None:
            if self.scope is not None:
                self._links = NamespaceLinks()
            else:
                self._links = NamespaceLinks.read({ns: self.pids_in(ns) for ns in self.ns_pid})
        return self._links

    def _nearest(self, s: Sock, cands: list[Sock]) -> list[Sock]:
        """Candidates for s's other end, nearest first: in s's own namespace, then in one joined to it by links
        (ns_links: where one path exists twice, the same four addresses are also in the other copy's namespaces)."""
        if len({x.netns for x in cands}) < 2:
            return cands
        return sorted(cands, key=lambda x: (x.netns != s.netns, not self.links.joined(s.netns, x.netns)))

    def _conntrack(self) -> list:
        if self._ct is None:
            self._ct = []
            for ns, pid in self.ns_pid.items():
                text = _read(f"/proc/{pid}/net/nf_conntrack")
                if not text and os.path.exists("/usr/sbin/conntrack"):
                    ref = self.ns_ref(ns)
                    text = subprocess.run(netns_argv(ref, ["conntrack", "-L", "-p", "tcp"]), capture_output=True,
                                          text=True, timeout=10).stdout
                self._ct += parse_conntrack(text)
        return self._ct

    def _load_unix(self) -> None:
        if self._unix_read:
            return
        self._unix_read = True
        for ns in self.ns_pid:
            try:
                text = subprocess.run(netns_argv(self.ns_ref(ns), ["ss", "-Hxa"]), capture_output=True, text=True,
                                      timeout=10).stdout
            except (OSError, subprocess.SubprocessError):
                continue
            self.socks += [s for s in parse_ss_unix(text, ns) if s.inode in self.owners]
