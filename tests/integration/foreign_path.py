"""A path built the way a user's deployment is, with plain `ip`/`iptables`/`initdb` commands and not with
pathprof's builder: PostgreSQL in a namespace of its own behind a veth, a pooler (pgbouncer) in the root
namespace in front of it, clients in the root namespace. pathprof must find it and profile it."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager

PG_BIN = "/usr/lib/postgresql/15/bin"
NS, HOST_IF, DB_IF = "pp-t11-db", "pp-t11-h", "pp-t11-d"
HOST_IP, DB_IP = "198.18.211.1", "198.18.211.2"
TWIN_HOST, TWIN_DB, TWIN_HOST_IF, TWIN_DB_IF = "pp-t11-th", "pp-t11-td", "pp-t11-th0", "pp-t11-td0"
# a session opened from a chosen source port (libpq cannot choose one): the startup packet by hand, the server's
# answer read up to ReadyForQuery, then idle until killed (bounded: 60 s)
HOLD_SESSION = """
import socket, struct, sys, time
s = socket.create_connection((sys.argv[3], 5432), timeout=20, source_address=(sys.argv[1], int(sys.argv[2])))
params = b"user\\0postgres\\0database\\0postgres\\0\\0"
s.sendall(struct.pack("!ii", 8 + len(params), 196608) + params)
buf = b""
while b"Z\\0\\0\\0\\x05" not in buf:
    chunk = s.recv(4096)
    if not chunk:
        sys.exit("the server closed the connection: " + repr(buf[:200]))
    buf += chunk
print("ready", flush=True)
time.sleep(60)
"""


def _sh(*argv: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    full = ["ip", "netns", "exec", ns, *argv] if ns else list(argv)
    return subprocess.run(full, check=check, capture_output=True, text=True, timeout=60)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(host: str, port: int, ns: str | None = None, timeout: float = 30.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if _sh(f"{PG_BIN}/pg_isready", "-q", "-h", host, "-p", str(port), ns=ns, check=False).returncode == 0:
            return
        time.sleep(0.2)
    raise AssertionError(f"nothing answered on {host}:{port}")


def _pgbouncer(tmp: str, port: int) -> list[str]:
    """pgbouncer in front of the server, configured by hand as a user would. (socat in fork mode was the first
    choice; on this 2-core machine it left connections stalled for seconds with or without pathprof.)"""
    conf = os.path.join(tmp, "pgbouncer.ini")
    with open(os.path.join(tmp, "userlist.txt"), "w") as f:
        f.write('"postgres" ""\n')
    with open(conf, "w") as f:
        f.write(f"""[databases]
postgres = host={DB_IP} port=5432 dbname=postgres user=postgres
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir = {tmp}
auth_type = trust
auth_file = {tmp}/userlist.txt
pool_mode = session
default_pool_size = 20
max_client_conn = 50
ignore_startup_parameters = extra_float_digits
logfile = {tmp}/pgbouncer.log
""")
    for name in ("pgbouncer.ini", "userlist.txt"):
        shutil.chown(os.path.join(tmp, name), "postgres", "postgres")
    return ["runuser", "-u", "postgres", "--", "/usr/sbin/pgbouncer", conf]


def _start_postgres(tmp: str, ns: str, procs: list) -> str:
    """initdb and a server on DB_IP:5432 inside `ns`, started into procs; its data directory."""
    data = os.path.join(tmp, "data")
    shutil.chown(tmp, "postgres", "postgres")
    _sh("runuser", "-u", "postgres", "--", f"{PG_BIN}/initdb", "-D", data, "-A", "trust", "-U", "postgres")
    with open(os.path.join(data, "pg_hba.conf"), "a") as f:
        f.write("host all all 198.18.0.0/15 trust\n")
    pg = subprocess.Popen(["ip", "netns", "exec", ns, "runuser", "-u", "postgres", "--", f"{PG_BIN}/postgres",
                           "-D", data, "-c", f"listen_addresses={DB_IP}", "-c", f"unix_socket_directories={tmp}",
                           "-c", "max_connections=60", "-c", "fsync=off"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    procs.append(pg)
    _wait_port(DB_IP, 5432, ns=ns)
    return data


@contextmanager
def foreign_path():
    """Yields {"port": pgbouncer's port on 127.0.0.1, "pg_port", "postmaster": pid, "netns"}."""
    tmp = tempfile.mkdtemp(prefix="pp-t11-")
    procs: list[subprocess.Popen] = []
    try:
        _sh("ip", "netns", "add", NS)
        _sh("ip", "link", "add", HOST_IF, "type", "veth", "peer", "name", DB_IF)
        _sh("ip", "link", "set", DB_IF, "netns", NS)
        _sh("ip", "addr", "add", f"{HOST_IP}/30", "dev", HOST_IF)
        _sh("ip", "link", "set", HOST_IF, "up")
        _sh("ip", "addr", "add", f"{DB_IP}/30", "dev", DB_IF, ns=NS)
        _sh("ip", "link", "set", DB_IF, "up", ns=NS)
        _sh("ip", "link", "set", "lo", "up", ns=NS)
        # a rule of the user's own in the server's namespace: netfilter runs there
        _sh("iptables", "-A", "INPUT", "-p", "tcp", "--dport", "5432", "-j", "ACCEPT", ns=NS)
        data = _start_postgres(tmp, NS, procs)
        port = free_port()
        fwd = subprocess.Popen(_pgbouncer(tmp, port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               stdin=subprocess.DEVNULL)
        procs.append(fwd)
        _wait_port("127.0.0.1", port)
        postmaster = int(open(os.path.join(data, "postmaster.pid")).readline())
        yield {"port": port, "pg_port": 5432, "postmaster": postmaster, "netns": NS}
    finally:
        stop_processes(procs)
        _sh("ip", "netns", "del", NS, check=False)
        _sh("ip", "link", "del", HOST_IF, check=False)
        shutil.rmtree(tmp, ignore_errors=True)


def pgbench(port: int, clients: int, seconds: int, tmp: str, log_dir: str | None = None,
            rate: int | None = None) -> subprocess.Popen:
    """A pgbench the test starts itself (select 1, prepared), logging progress every second (and every
    transaction into log_dir, when given); `rate`: transactions per second in all (-R), each client idle between."""
    script = os.path.join(tmp, "select1.sql")
    with open(script, "w") as f:
        f.write("select 1;\n")
    logging = ["-l", "--log-prefix", os.path.join(log_dir, "pgbench_log")] if log_dir else []
    return subprocess.Popen([f"{PG_BIN}/pgbench", "-n", "-M", "prepared", "-f", script, "-c", str(clients),
                             "-j", str(min(clients, 2)), "-T", str(seconds), "-P", "1", *logging,
                             *(["-R", str(rate)] if rate else []), "-h", "127.0.0.1",
                             "-p", str(port), "-U", "postgres", "postgres"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)


def wait_connected(port: int, n: int, timeout: float = 30.0) -> None:
    """Until n client connections to 127.0.0.1:port are established (pgbench has started its load)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        out = _sh("ss", "-Htn", "state", "established", f"( sport = :{port} )").stdout
        if len(out.splitlines()) >= n:
            return
        time.sleep(0.2)
    raise AssertionError(f"pgbench did not connect {n} clients to port {port}")


def _signalled(pid: int) -> list[int]:
    """The process that gets the terminate: runuser's child rather than runuser itself, which, once it caught a
    signal, forwards it and then sleeps 2 s before it kills (util-linux su-common); 4 s of every foreign_path."""
    try:
        if open(f"/proc/{pid}/comm").read().strip() != "runuser":
            return [pid]
        children = [int(c) for c in open(f"/proc/{pid}/task/{pid}/children").read().split()]
    except OSError:
        return [pid]
    return children or [pid]


def stop_processes(procs: list) -> None:
    """Terminate what a hand-built path started, newest first; kill what does not exit within 20 s."""
    for p in reversed(procs):
        for pid in _signalled(p.pid):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@contextmanager
def twin_server():
    """foreign_path's server side once more, in namespaces of its own with the same addresses: a "host" namespace
    (HOST_IP) joined by a veth to a server's (DB_IP:5432) -- one path twice, as two pods' or two lanes' copies are.
    Made before foreign_path, its server's processes come first in /proc. Yields session_from(port): a session to
    the twin's server from HOST_IP:port (a port another connection of the machine uses), open when it returns."""
    tmp = tempfile.mkdtemp(prefix="pp-t11-twin-")
    procs: list[subprocess.Popen] = []
    try:
        for ns in (TWIN_HOST, TWIN_DB):
            _sh("ip", "netns", "add", ns)
        _sh("ip", "link", "add", TWIN_HOST_IF, "type", "veth", "peer", "name", TWIN_DB_IF, ns=TWIN_HOST)
        _sh("ip", "link", "set", TWIN_DB_IF, "netns", TWIN_DB, ns=TWIN_HOST)
        _sh("ip", "addr", "add", f"{HOST_IP}/30", "dev", TWIN_HOST_IF, ns=TWIN_HOST)
        _sh("ip", "link", "set", TWIN_HOST_IF, "up", ns=TWIN_HOST)
        _sh("ip", "addr", "add", f"{DB_IP}/30", "dev", TWIN_DB_IF, ns=TWIN_DB)
        _sh("ip", "link", "set", TWIN_DB_IF, "up", ns=TWIN_DB)
        _sh("ip", "link", "set", "lo", "up", ns=TWIN_DB)
        _start_postgres(tmp, TWIN_DB, procs)

        def session_from(port: int) -> None:
            p = subprocess.Popen(["ip", "netns", "exec", TWIN_HOST, "timeout", "60", sys.executable, "-c",
                                  HOLD_SESSION, HOST_IP, str(port), DB_IP], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
            procs.append(p)
            if p.stdout.readline().strip() != "ready":
                p.kill()
                raise AssertionError(f"no session from {HOST_IP}:{port} in {TWIN_HOST}: {p.communicate()[1][-2000:]}")
        yield session_from
    finally:
        stop_processes(procs)
        for ns in (TWIN_DB, TWIN_HOST):
            _sh("ip", "netns", "del", ns, check=False)
        shutil.rmtree(tmp, ignore_errors=True)
