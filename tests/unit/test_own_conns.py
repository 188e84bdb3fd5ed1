"""pathprof's own connections are named to the probes by their client end as the accepting side sees it
(agent/probing/own_conns.py): the key must be the namespace, address and port the server's socket has as its
remote end, laid out as struct pp_own_key."""
import ctypes as C
import os
import socket

from pathprof.agent.probing import own_conns
from pathprof.agent.probing.bpf import layout as L


def test_the_key_is_the_accepted_socket_s_remote_end():
    srv = socket.create_server(("127.0.0.1", 0))
    cli = socket.create_connection(srv.getsockname())
    acc, peer = srv.accept()
    try:
        key = own_conns.key(cli.fileno())
        assert len(key) == C.sizeof(L.struct("pp_own_key"))
        netns = int.from_bytes(key[0:4], "little")
        assert netns == os.stat("/proc/self/ns/net").st_ino
        assert socket.inet_ntoa(key[4:8]) == peer[0] == "127.0.0.1"
        assert int.from_bytes(key[8:10], "little") == peer[1] == acc.getpeername()[1]
    finally:
        for s in (acc, cli, srv):
            s.close()
