"""Which namespaces links join (agent/discovery/ns_links.py), read from real namespaces while processes come and go.

Found in CI (stop 55): attach followed the other copy's server of a path that exists twice, because the process
first seen in one namespace of the other lane had exited before its namespace was asked about; the answer by pid
failed and took every namespace's links with it. Ground truth built here: two namespaces joined by a veth, a third
one alone, and processes that have exited by the time the links are read."""
from __future__ import annotations

import os
import subprocess
import time
from contextlib import contextmanager

import pytest
from pathprof.agent.discovery.ns_links import NamespaceLinks

pytestmark = [pytest.mark.integration, pytest.mark.skipif(os.geteuid() != 0, reason="needs root (namespaces)")]


def _ip(*argv: str) -> None:
    subprocess.run(["ip", *argv], check=True, capture_output=True, timeout=30)


@contextmanager
def _namespaces():
    """Three namespaces (a, b joined by a veth; c alone), each with a process inside: {name: (inode, pid)}."""
    tag = f"pp-nl{os.getpid() % 100000}"
    names = [f"{tag}-{x}" for x in "abc"]
    procs = []
    try:
        for n in names:
            _ip("netns", "add", n)
        _ip("-n", names[0], "link", "add", f"{tag}a0", "type", "veth", "peer", "name", f"{tag}b0", "netns", names[1])
        out = {}
        for n in names:
            p = subprocess.Popen(["ip", "netns", "exec", n, "sleep", "60"], stdin=subprocess.DEVNULL)
            procs.append(p)
            out[n] = (os.stat(f"/run/netns/{n}").st_ino, p.pid)
        for ino, pid in out.values():
            _wait_inside(pid, ino)
        yield out
    finally:
        for p in procs:
            p.kill()
            p.wait()
        for n in names:
            subprocess.run(["ip", "netns", "del", n], capture_output=True, timeout=30)


def _gone_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def _wait_inside(pid: int, ino: int) -> None:
    """Until `ip netns exec` has moved the process into its namespace (it starts in ours)."""
    deadline = time.monotonic() + 5
    while os.stat(f"/proc/{pid}/ns/net").st_ino != ino:
        assert time.monotonic() < deadline, f"process {pid} never entered namespace {ino}"
        time.sleep(0.01)


def test_links_are_read_when_processes_of_other_namespaces_have_gone():
    with _namespaces() as ns:
        (a, pa), (b, pb), (c, pc) = ns.values()
        me = os.stat("/proc/self/ns/net").st_ino
        gone = _gone_pid()
        links = NamespaceLinks.read({
            me: [os.getpid()],
            a: [gone, pa],            # its first process has gone: the next one is asked
            b: [pb],
            c: [pc],
            0xDEAD: [gone],           # a namespace whose every process has gone
        })
        assert links.joined(a, b) and links.joined(b, a)
        assert not links.joined(a, c) and not links.joined(b, c) and not links.joined(a, me)
        # a pid reused by a process of another namespace is not taken for the one it left
        links = NamespaceLinks.read({me: [os.getpid()], a: [pc], b: [pb], c: [pc]})
        assert links.joined(b, b) and not links.joined(a, b) and not links.joined(c, b)


def test_links_are_read_with_fewer_free_file_descriptors_than_namespaces():
    """Each namespace is held open while the links are read: with the soft limit on open files just above what the
    process holds (a node with more pods than it), the limit is raised, not the namespaces left out."""
    import resource
    with _namespaces() as ns:
        (a, pa), (b, pb), (c, pc) = ns.values()
        me = os.stat("/proc/self/ns/net").st_ino
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 1, hard))
        try:
            links = NamespaceLinks.read({me: [os.getpid()], a: [pa], b: [pb], c: [pc]})
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert links.joined(a, b) and not links.joined(a, c)
