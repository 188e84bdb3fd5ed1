"""Processes the postmaster forks while a run goes on: the kernel makes every one a backend at its fork
(pp_fork); the ones that turn out not to be client backends (a walsender, an autovacuum worker, a background
worker) are re-tracked as pg_aux of their kind, so their traffic is not counted as transactions.

Real probes (pathprof.bpf.o) and real processes: a stand-in postmaster that forks children which retitle
themselves as PostgreSQL's do (setproctitle clobbers argv: /proc/PID/cmdline shows the title)."""
import ctypes as C
import os
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="BPF needs root")

POSTMASTER = r"""
import os, sys, time, setproctitle
for line in sys.stdin:
    titles = line.strip().split("|")         # a title, or a first one and the one it becomes 0.5 s later
    if os.fork() == 0:
        time.sleep(0.05)                     # a child starts with its parent's title, retitles itself later
        setproctitle.setproctitle(titles[0])
        if len(titles) > 1:
            time.sleep(0.5)
            setproctitle.setproctitle(titles[1])
        time.sleep(60)
        os._exit(0)
    print("forked", flush=True)
"""
TORN = "postgres: 15/main: app sh"           # a client's title read half-written


def children(pid: int) -> list[int]:
    return [int(c) for c in open(f"/proc/{pid}/task/{pid}/children").read().split()]


def role_of(session, pid: int) -> str:
    from pathprof.agent.probing.bpf import layout as L
    fd = os.pidfd_open(pid, os.O_EXCL)
    try:
        raw = session.main.maps["tasks"].lookup(bytes(C.c_int(fd)))
    finally:
        os.close(fd)
    t = L.Task.from_buffer_copy(raw)
    name = L.ROLE_NAMES[t.role]
    return f"{name}.{L.AUX_NAMES[t.hop]}" if name == "pg_aux" else name


def test_children_forked_during_the_run_are_tracked_by_what_they_are():
    from pathprof.agent.discovery.profiled_path import ForeignServer
    from pathprof.agent.probing.session import ProbeConfig, ProbeSession
    from pathprof.agent.run import recorder
    pm = subprocess.Popen([sys.executable, "-c", POSTMASTER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True)
    session = ProbeSession(ProbeConfig(level="basic", service_ports=[5432], hop_slots=1))
    try:
        session.start()
        recorder.track_path(session, ForeignServer(pm.pid), [])
        titles = {"walsender": "postgres: 15/main: walsender replicator 127.0.0.1(40512) streaming 0/3000148",
                  "autovacuum": "postgres: autovacuum worker",
                  "bgworker": "postgres: 15/main: logical replication worker for subscription 16394",
                  "client": "postgres: 15/main: app shop 127.0.0.1(40514) idle",
                  "local": "postgres: app shop [local] idle",
                  "torn": "postgres: 15/main: app shop 127.0.0.1(40516) idle"}
        for name, title in titles.items():
            pm.stdin.write((f"{TORN}|{title}" if name == "torn" else title) + "\n")
            pm.stdin.flush()
            assert pm.stdout.readline().strip() == "forked"
        kids = children(pm.pid)
        assert len(kids) == len(titles)
        time.sleep(0.3)                                  # all retitled, the torn one still torn
        session.open_window()                            # a window opens: the server's children are looked at
        session.close_window()
        time.sleep(0.5)                                  # the torn title is whole now
        session.refresh_server()                         # the next look (every 0.5 s inside a window)
        by_title = {open(f"/proc/{k}/cmdline").read().strip("\0 "): role_of(session, k) for k in kids}
        assert by_title == {titles["walsender"]: "pg_aux.other", titles["autovacuum"]: "pg_aux.autovacuum",
                            titles["bgworker"]: "pg_aux.other", titles["client"]: "backend",
                            titles["local"]: "backend", titles["torn"]: "backend"}, by_title
    finally:
        session.close()
        for k in children(pm.pid) if pm.poll() is None else []:
            os.kill(k, 9)
        pm.kill()
        pm.wait()
