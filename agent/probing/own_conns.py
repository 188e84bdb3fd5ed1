"""pathprof's own connections into the path it measures (a pooler's counters connection, SHOW POOLS five times a
second) are not the workload's: the probes must not learn the tracked processes' ends of them, or their queries
would be messages, stages, held requests and sampled transactions like pgbench's (served_by listed pgpool's
counters child's backend). User space names each such connection in the `own_conns` map by its client end as the
server side sees it -- the namespace, address and port of pathprof's socket -- and the probes leave every socket
whose remote end that is unknown (pp_state.bpf.h own_conn)."""
from __future__ import annotations

import ctypes as C
import fcntl
import os
import socket

SIOCGSKNS = 0x894C          # ioctl: a socket's network namespace, as a new fd (Linux >= 4.9)


def key(fd: int) -> bytes:
    """The `own_conns` key (struct pp_own_key) of pathprof's TCP socket `fd`: its namespace's inode and its
    local IPv4 address and port, which the accepting side sees as the remote end."""
    s = socket.socket(fileno=os.dup(fd))
    try:
        addr, port = s.getsockname()[:2]
        ns_fd = fcntl.ioctl(s.fileno(), SIOCGSKNS)
    finally:
        s.close()
    try:
        netns = os.fstat(ns_fd).st_ino
    finally:
        os.close(ns_fd)
    return (bytes(C.c_uint32(netns)) + socket.inet_aton(addr) + bytes(C.c_uint16(port)) + bytes(2))


def register(own_map, fd: int) -> None:
    own_map.update(key(fd), b"\x01")
