"""Which network namespaces are joined by links (a veth pair, a macvlan or ipvlan on its parent, a vxlan): the
kernel names a link's other namespace by an id local to each namespace (IFLA_LINK_NETNSID), so each namespace is
asked over rtnetlink for its links' ids (RTM_GETLINK) and for the id it gives each other namespace (RTM_GETNSID, by
a pid inside it). Reading only.

Path discovery needs it where one path exists twice: two pods' sidecar poolers, two copies of one deployment, two
test lanes -- each copy's server in a namespace of its own with the same addresses. A connection then has the
same four addresses in both copies (the kernel's ephemeral ports do not depend on the namespace), and only the
links say which server answers which pooler: a connection's two ends are in namespaces a chain of links joins.

Each namespace is held open by a file descriptor for the whole read and asked about by it (NETNSA_FD), not by a
pid: on a busy machine the process first seen in some namespace exits before it is asked about, and an answer
by pid then fails (ESRCH) -- once for one namespace, which must not lose the links of all the others (CI, stop
55: attach followed the other copy's server because one short-lived process of another namespace had gone).
"""
from __future__ import annotations

import os
import socket
import struct
from contextlib import ExitStack

from pathprof.agent.host.netns import in_netns

NETLINK_ROUTE = 0
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
RTM_NEWLINK, RTM_GETLINK = 16, 18
RTM_NEWNSID, RTM_GETNSID = 88, 90
IFLA_LINK_NETNSID = 37
NETNSA_NSID, NETNSA_PID, NETNSA_FD = 1, 2, 3
NLA_TYPE_MASK = 0x3FFF
_HDR = struct.Struct("=IHHII")       # nlmsghdr: length, type, flags, sequence, port


def _attrs(buf: bytes, off: int, end: int):
    """(type, payload) of the rtattrs between off and end."""
    while off + 4 <= end:
        length, kind = struct.unpack_from("=HH", buf, off)
        if length < 4:
            return
        yield kind & NLA_TYPE_MASK, buf[off + 4:off + length]
        off += (length + 3) & ~3


def _messages(sock: socket.socket, seq: int):
    """The answers to request `seq`: (type, message bytes), until the dump's end or the one answer."""
    while True:
        data = sock.recv(1 << 16)
        off = 0
        while off + _HDR.size <= len(data):
            length, kind, flags, mseq, _ = _HDR.unpack_from(data, off)
            if length < _HDR.size:
                return
            msg = data[off:off + length]
            off += (length + 3) & ~3
            if mseq != seq:
                continue
            if kind == NLMSG_DONE:
                return
            if kind == NLMSG_ERROR:
                err = -struct.unpack_from("=i", msg, _HDR.size)[0]
                if err:
                    raise OSError(err, "rtnetlink refused the request")
                return
            yield kind, msg
            if not flags & 0x2:          # NLM_F_MULTI: a dump goes on until NLMSG_DONE; one answer ends here
                return


def link_nsids(sock: socket.socket, seq: int = 1) -> set[int]:
    """The ids this namespace gives the namespaces its links lead into."""
    ifinfo = struct.pack("=BxHiII", socket.AF_UNSPEC, 0, 0, 0, 0)
    sock.send(_HDR.pack(_HDR.size + len(ifinfo), RTM_GETLINK, NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + ifinfo)
    out = set()
    for kind, msg in _messages(sock, seq):
        if kind != RTM_NEWLINK:
            continue
        for a, payload in _attrs(msg, _HDR.size + 16, len(msg)):
            if a == IFLA_LINK_NETNSID and len(payload) >= 4:
                out.add(struct.unpack_from("=i", payload)[0])
    out.discard(-1)
    return out


def nsid_of(sock: socket.socket, ns_fd: int, seq: int) -> int | None:
    """The id this namespace gives the namespace open at file descriptor ns_fd (None: none given)."""
    body = struct.pack("=Bxxx", socket.AF_UNSPEC) + struct.pack("=HHI", 8, NETNSA_FD, ns_fd)
    sock.send(_HDR.pack(_HDR.size + len(body), RTM_GETNSID, NLM_F_REQUEST, seq, 0) + body)
    for kind, msg in _messages(sock, seq):
        if kind == RTM_NEWNSID:
            for a, payload in _attrs(msg, _HDR.size + 4, len(msg)):
                if a == NETNSA_NSID and len(payload) >= 4:
                    nsid = struct.unpack_from("=i", payload)[0]
                    return nsid if nsid >= 0 else None
    return None


def _ask(ns_fd: dict[int, int], me: int) -> set[int]:
    """Inside namespace `me`: the namespaces (inodes) its links lead into; one that cannot be asked about is
    left out, alone."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE) as s:
        s.settimeout(2.0)
        s.bind((0, 0))
        ids = link_nsids(s)
        if not ids:
            return set()
        out = set()
        for seq, (ino, fd) in enumerate(ns_fd.items(), start=2):
            try:
                if ino != me and nsid_of(s, fd, seq) in ids:
                    out.add(ino)
            except OSError:
                continue
        return out


def _room_for(n: int) -> None:
    """Raise the soft limit on open files, if need be, to hold n more (a node with a thousand pods)."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = len(os.listdir("/proc/self/fd")) + n + 64
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        except (ValueError, OSError):
            pass


def open_namespaces(stack: ExitStack, ns_pids: dict[int, list[int]]) -> dict[int, int]:
    """A file descriptor on each namespace (inode -> fd), opened through the first of its processes still there
    and still in it; closed with the stack. A namespace none of whose processes is left is not opened."""
    _room_for(len(ns_pids))
    out = {}
    for ino, pids in ns_pids.items():
        for pid in pids:
            try:
                fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue
            stack.callback(os.close, fd)
            if os.fstat(fd).st_ino == ino:      # not a new process that took a gone one's pid
                out[ino] = fd
                break
    return out


class NamespaceLinks:
    """The namespaces a chain of links joins, as groups (one look at the machine)."""

    def __init__(self, pairs=()):
        self._parent: dict[int, int] = {}
        for a, b in pairs:
            self._parent[self._root(a)] = self._root(b)

    def _root(self, ns: int) -> int:
        while self._parent.setdefault(ns, ns) != ns:
            ns = self._parent[ns]
        return ns

    def joined(self, a: int, b: int) -> bool:
        return a == b or self._root(a) == self._root(b)

    @classmethod
    def read(cls, ns_pids: dict[int, list[int]]) -> "NamespaceLinks":
        """Every namespace asked in turn (ns_pids: inode -> processes inside it, any of which will do); one that
        cannot be asked (gone, not root) has no links known, and the others keep theirs."""
        pairs = []
        with ExitStack() as stack:
            ns_fd = open_namespaces(stack, ns_pids)
            for ino, fd in ns_fd.items():
                try:
                    pairs += [(ino, other) for other in in_netns(f"/proc/self/fd/{fd}",
                                                                  lambda i=ino: _ask(ns_fd, i), timeout_s=5)]
                except (OSError, TimeoutError):
                    continue
        return cls(pairs)
