"""Socket tables and path following on hand-made tables (the integration tests do it on the real machine)."""
from __future__ import annotations

import os

from pathprof.agent.discovery import chain as discovery
from pathprof.agent.discovery.sockets import (
    Addr,
    Proc,
    Sock,
    SocketTable,
    parse_conntrack,
    parse_proc_tcp,
    parse_ss_unix,
)

TCP = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1538 00000000:0000 0A 00000000:00000000 00:00000000 00000000   106        0 41234 1
   1: 0100007F:D431 0100007F:1538 01 00000000:00000000 00:00000000 00000000     0        0 41240 1
"""
TCP6 = """  sl  local_address                         remote_address                        st tx_queue
   0: 0000000000000000FFFF00000100007F:1538 0000000000000000FFFF00000100007F:D432 01 0 0 0 0 0 0 0 777 1
"""
SS_UNIX = """u_str LISTEN 0 244 /run/postgresql/.s.PGSQL.5432 30733 * 0
u_str ESTAB 0 0 * 30801 * 30802
"""
CONNTRACK = ("ipv4     2 tcp      6 431999 ESTABLISHED src=198.18.0.1 dst=198.18.0.1 sport=40000 dport=49155 "
             "src=198.18.9.2 dst=198.18.0.1 sport=5432 dport=40000 [ASSURED] mark=0 zone=0 use=2\n"
             "ipv4     2 udp      17 20 src=1.1.1.1 dst=2.2.2.2 sport=1 dport=2 "
             "src=2.2.2.2 dst=1.1.1.1 sport=2 dport=1\n")


def test_proc_tcp_rows_decode_addresses_ports_states_and_inodes():
    rows = parse_proc_tcp(TCP, netns=7)
    assert [(str(r.local), str(r.remote), r.state, r.inode) for r in rows] == [
        ("127.0.0.1:5432", "0.0.0.0:0", "listen", 41234),
        ("127.0.0.1:54321", "127.0.0.1:5432", "established", 41240)]
    v6 = parse_proc_tcp(TCP6, netns=7)[0]
    assert v6.local == Addr("127.0.0.1", 5432) and v6.remote.port == 0xD432     # v4-mapped shown as v4


def test_unix_rows_and_conntrack_entries():
    lst, est = parse_ss_unix(SS_UNIX, netns=1)
    assert lst.state == "listen" and lst.path.endswith(".s.PGSQL.5432") and lst.inode == 30733
    assert est.state == "established" and est.path == "" and est.peer_inode == 30802
    (o_src, o_dst, r_src, r_dst), = parse_conntrack(CONNTRACK)       # udp skipped
    assert o_dst == Addr("198.18.0.1", 49155) and r_src == Addr("198.18.9.2", 5432) and r_dst == o_src


def _table() -> SocketTable:
    """client (pid 10, ns 1) -> published port 49155, DNAT -> a proxy (pid 20, ns 1) would be the userland
    variant; here the kernel rewrote it: the server's backend (pid 31, ns 2) holds the other end."""
    t = SocketTable(root_ns=1)
    t.procs = {10: Proc(10, "myapp", 1, 1), 30: Proc(30, "postgres", 1, 2), 31: Proc(31, "postgres", 30, 2)}
    t.ns_pid = {1: 10, 2: 30}
    t._unix_read = True
    client = Sock(1, "tcp", "established", 100, Addr("198.18.0.1", 40000), Addr("198.18.0.1", 49155))
    backend = Sock(2, "tcp", "established", 200, Addr("198.18.9.2", 5432), Addr("198.18.0.1", 40000))
    listen = Sock(2, "tcp", "listen", 300, Addr("0.0.0.0", 5432), Addr("0.0.0.0", 0))
    t.socks = [client, backend, listen]
    t.owners = {100: [10], 200: [31], 300: [30]}
    t._ct = parse_conntrack(CONNTRACK)
    return t


def test_a_nat_rewritten_connection_is_followed_through_conntrack():
    t = _table()
    other, how = t.peer(t.socks[0])
    assert other.inode == 200 and how == "nat"
    back, how = t.peer(other)                  # and from the server's side back to the client (attach)
    assert back.inode == 100 and how == "nat"
    path = discovery.follow(t, t.socks[0])
    assert path.postmaster == 30 and path.hops == [] and path.namespaces == [1, 2] and 5432 in path.ports


def test_an_unanswered_connection_is_said_not_guessed():
    t = _table()
    t._ct = []
    t.socks = [t.socks[0]]                 # the server side is not on this machine
    path = discovery.follow(t, t.socks[0])
    assert path.postmaster is None and "not answered by any process" in path.unseen[0]


def test_hop_roles_by_command():
    assert [discovery.hop_role(c) for c in ("pgbouncer", "pgpool", "docker-proxy", "socat", "qemu-system-x86",
                                            "mystery")] == ["pooler", "pooler", "proxy", "proxy", "qemu", "other"]


def _pooler_host() -> SocketTable:
    """The pooler's machine of a 3-host path: pgbouncer (pid 20, ns 5) answers a client on another machine
    (198.18.12.1) and holds one connection onward to a server on a third (198.18.12.3:5432): no PostgreSQL here."""
    t = SocketTable(root_ns=5)
    t.procs = {20: Proc(20, "pgbouncer", 1, 5)}
    t.ns_pid = {5: 20}
    t._unix_read, t._ct = True, []
    t.socks = [Sock(5, "tcp", "listen", 500, Addr("198.18.12.2", 6432), Addr("0.0.0.0", 0)),
               Sock(5, "tcp", "established", 501, Addr("198.18.12.2", 6432), Addr("198.18.12.1", 40000)),
               Sock(5, "tcp", "established", 502, Addr("198.18.12.2", 50000), Addr("198.18.12.3", 5432))]
    t.owners = {500: [20], 501: [20], 502: [20]}
    return t


def test_a_hop_whose_server_is_on_another_machine_is_the_last_hop_here():
    path, t = discovery.from_port(6432, _pooler_host())
    assert [h.name for h in path.hops] == ["pgbouncer"] and path.postmaster is None
    assert path.onward_remote == ["198.18.12.3:5432"]
    assert {6432, 5432} <= path.ports                  # the onward port gives its packets their legs
    assert path.client_connections == 1                # from another machine: counted, its side not measured
    assert any("198.18.12.3:5432" in u and "another machine" in u for u in path.unseen), path.unseen
    from pathprof.agent.discovery import edge
    leaving = edge.leaving(t, edge.path_pids(t, path))
    assert [(c["side"], c["remote"]) for c in leaving] == [("client", "198.18.12.3:5432"),
                                                          ("server", "198.18.12.1:40000")]


def test_a_hop_with_no_connection_onward_is_still_refused():
    t = _pooler_host()
    t.socks = t.socks[:2]
    path, _ = discovery.from_port(6432, t)
    assert path.onward_remote == [] and path.postmaster is None
    import pytest
    from pathprof.agent.run.attach import check_profilable
    from pathprof.errors import UserError
    with pytest.raises(UserError, match="no connection onward"):
        check_profilable(path, "port 6432")


def test_attach_keeps_the_leaving_connections_opened_after_its_start(monkeypatch):
    from pathprof.agent.run import attach
    t = _pooler_host()
    path, _ = discovery.from_port(6432, t)
    watch = attach.LeavingConnections("pp-pool", t, path)
    later = _pooler_host()                  # one more client came, the first one left
    later.socks = [later.socks[0], later.socks[2],
                   Sock(5, "tcp", "established", 503, Addr("198.18.12.2", 6432), Addr("198.18.12.1", 40002))]
    later.owners[503] = [20]
    monkeypatch.setattr(SocketTable, "take", classmethod(lambda cls, netns=None: later))
    watch.look()                            # too soon after the start: no look
    assert len(watch.doc()) == 2
    watch.last -= attach.LeavingConnections.LOOK_EVERY_S
    watch.look()
    assert [(c["side"], c["remote"]) for c in watch.doc()] == [
        ("client", "198.18.12.3:5432"), ("server", "198.18.12.1:40000"), ("server", "198.18.12.1:40002")]
    assert watch.note() is None
    monkeypatch.setattr(SocketTable, "take", classmethod(lambda cls, netns=None: 1 / 0))
    watch.last -= attach.LeavingConnections.LOOK_EVERY_S
    watch.look()
    assert "ZeroDivisionError" in watch.note() and len(watch.doc()) == 3


def _two_copies(first: str) -> SocketTable:
    """One path twice (two pods, two test lanes): pgbouncer (pid 20, ns 1) connects from 198.18.211.1:40000 to a
    server at 198.18.211.2:5432 in ns 2, joined to ns 1 by a veth; the copy's client (pid 50, ns 3) holds a
    connection with the same four addresses to its own server in ns 4 (the kernel's ephemeral ports do not depend
    on the namespace). `first`: whose sockets the table lists first (the order /proc gave)."""
    t = SocketTable(root_ns=1)
    t.procs = {20: Proc(20, "pgbouncer", 1, 1), 30: Proc(30, "postgres", 1, 2), 31: Proc(31, "postgres", 30, 2),
               40: Proc(40, "postgres", 1, 4), 41: Proc(41, "postgres", 40, 4), 50: Proc(50, "myapp", 1, 3)}
    t.ns_pid = {1: 20, 2: 30, 3: 50, 4: 40}
    t._unix_read, t._ct = True, []
    a, b = Addr("198.18.211.1", 40000), Addr("198.18.211.2", 5432)
    pooler = Sock(1, "tcp", "established", 100, a, b)
    ours = [Sock(2, "tcp", "established", 200, b, a), Sock(2, "tcp", "listen", 201, Addr("198.18.211.2", 5432),
                                                             Addr("0.0.0.0", 0))]
    theirs = [Sock(3, "tcp", "established", 300, a, b), Sock(4, "tcp", "established", 400, b, a),
              Sock(4, "tcp", "listen", 401, Addr("198.18.211.2", 5432), Addr("0.0.0.0", 0))]
    t.socks = [pooler, *(theirs + ours if first == "theirs" else ours + theirs)]
    t.owners = {100: [20], 200: [31], 201: [30], 300: [50], 400: [41], 401: [40]}
    return t


def test_one_path_twice_each_end_is_matched_in_the_namespaces_its_links_join():
    from pathprof.agent.discovery.ns_links import NamespaceLinks
    for first in ("theirs", "ours"):
        t = _two_copies(first)
        t._links = NamespaceLinks([(1, 2), (3, 4)])
        other, how = t.peer(t.socks[0])
        assert (other.inode, how) == (200, "connection"), first
        assert discovery.follow(t, t.socks[0]).postmaster == 30, first
        # the copy's own connection goes to its own server, either way round
        theirs = next(s for s in t.socks if s.inode == 300)
        assert t.peer(theirs)[0].inode == 400
        # a connection only a listener can answer: the one in a joined namespace, not "two owners, none"
        lone = Sock(1, "tcp", "established", 101, Addr("198.18.211.1", 40001), Addr("198.18.211.2", 5432))
        assert t.peer(lone) == (next(s for s in t.socks if s.inode == 201), "listener")


def test_namespace_links_join_in_chains():
    from pathprof.agent.discovery.ns_links import NamespaceLinks
    links = NamespaceLinks([(1, 2), (2, 5), (3, 4)])
    assert links.joined(1, 5) and links.joined(5, 1) and links.joined(3, 4) and links.joined(7, 7)
    assert not links.joined(1, 3) and not links.joined(4, 5) and not links.joined(1, 9)


def test_a_namespace_is_referred_to_through_the_paths_own_process_in_it():
    """A container's namespace has no name: ns_ref is /proc/PID/ns/net of a process in it, and the one first seen
    there may be short-lived; the path's server (then hops, clients) is taken instead, if it is still there."""
    me = os.getpid()
    t = SocketTable(root_ns=1)
    t.procs = {4_000_000: Proc(4_000_000, "psql", 1, 7), me: Proc(me, "postgres", 1, 7),
               4_000_001: Proc(4_000_001, "pgbouncer", 1, 8)}
    t.ns_pid = {7: 4_000_000, 8: 4_000_001}
    t.anchor_namespaces([me, 4_000_001, 123])      # 4_000_001 has gone (no such pid), 123 is not in the table
    assert t.ns_pid == {7: me, 8: 4_000_001}
    assert t.ns_ref(7) == f"/proc/{me}/ns/net"
