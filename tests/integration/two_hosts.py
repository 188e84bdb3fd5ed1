"""Two "machines" on one kernel, built by hand as a user's would be: a client namespace and a server namespace
joined by a veth wire, PostgreSQL in the server one behind a published port (an iptables DNAT rule
198.18.21.2:15432 -> :5432, as Docker publishes one), pgbench in the client one. Each is attached by its own
pathprof (`attach --netns`), and `pathprof merge` joins them (tests/integration/test_merge_hosts.py)."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from contextlib import contextmanager

from foreign_path import stop_processes  # tests/integration is on sys.path, as for this module

PG_BIN = "/usr/lib/postgresql/15/bin"
CLI, SRV = "pp-h21-cli", "pp-h21-srv"
CLI_IF, SRV_IF = "pp-h21-c", "pp-h21-s"
CLI_IP, SRV_IP = "198.18.21.1", "198.18.21.2"
PUBLISHED, PG_PORT = 15432, 5432


def sh(*argv: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    full = ["ip", "netns", "exec", ns, *argv] if ns else list(argv)
    return subprocess.run(full, check=check, capture_output=True, text=True, timeout=60)


def _wait_ready(timeout: float = 30.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if sh(f"{PG_BIN}/pg_isready", "-q", "-h", SRV_IP, "-p", str(PUBLISHED), ns=CLI, check=False).returncode == 0:
            return
        time.sleep(0.2)
    raise AssertionError("the server did not answer through the published port")


@contextmanager
def two_hosts():
    """Yields {"client_ns", "server_ns", "remote": the address the clients dial, "pg_port", "tmp"}."""
    tmp = tempfile.mkdtemp(prefix="pp-h21-")
    procs: list[subprocess.Popen] = []
    try:
        for ns in (CLI, SRV):
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "set", "lo", "up", ns=ns)
        sh("ip", "link", "add", CLI_IF, "netns", CLI, "type", "veth", "peer", "name", SRV_IF, "netns", SRV)
        sh("ip", "addr", "add", f"{CLI_IP}/30", "dev", CLI_IF, ns=CLI)
        sh("ip", "addr", "add", f"{SRV_IP}/30", "dev", SRV_IF, ns=SRV)
        sh("ip", "link", "set", CLI_IF, "up", ns=CLI)
        sh("ip", "link", "set", SRV_IF, "up", ns=SRV)
        sh("iptables", "-t", "nat", "-A", "PREROUTING", "-p", "tcp", "-d", SRV_IP, "--dport", str(PUBLISHED),
           "-j", "DNAT", "--to-destination", f"{SRV_IP}:{PG_PORT}", ns=SRV)
        data = os.path.join(tmp, "data")
        shutil.chown(tmp, "postgres", "postgres")
        sh("runuser", "-u", "postgres", "--", f"{PG_BIN}/initdb", "-D", data, "-A", "trust", "-U", "postgres")
        with open(os.path.join(data, "pg_hba.conf"), "a") as f:
            f.write("host all all 198.18.0.0/15 trust\n")
        procs.append(subprocess.Popen(
            ["ip", "netns", "exec", SRV, "runuser", "-u", "postgres", "--", f"{PG_BIN}/postgres", "-D", data, "-c",
             f"listen_addresses={SRV_IP}", "-c", f"unix_socket_directories={tmp}", "-c", "fsync=off"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL))
        _wait_ready()
        yield {"client_ns": CLI, "server_ns": SRV, "remote": f"{SRV_IP}:{PUBLISHED}", "pg_port": PG_PORT,
               "tmp": tmp}
    finally:
        stop_processes(procs)
        for ns in (CLI, SRV):
            sh("ip", "netns", "del", ns, check=False)
        shutil.rmtree(tmp, ignore_errors=True)


def pgbench(clients: int, seconds: int, tmp: str, rate: int | None = None) -> subprocess.Popen:
    """select 1 (prepared) from the client namespace through the published port (at most `rate` TPS)."""
    script = os.path.join(tmp, "select1.sql")
    with open(script, "w") as f:
        f.write("select 1;\n")
    return subprocess.Popen(["ip", "netns", "exec", CLI, f"{PG_BIN}/pgbench", "-n", "-M", "prepared", "-f", script,
                             "-c", str(clients), "-j", "1", "-T", str(seconds), *(["-R", str(rate)] if rate else []),
                             "-h", SRV_IP, "-p", str(PUBLISHED),
                             "-U", "postgres", "postgres"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)


def wait_connected(n: int, timeout: float = 20.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        out = sh("ss", "-Htn", "state", "established", f"( dport = :{PUBLISHED} )", ns=CLI).stdout
        if len(out.splitlines()) >= n:
            return
        time.sleep(0.2)
    raise AssertionError(f"pgbench did not connect {n} clients")
