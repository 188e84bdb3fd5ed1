"""Running code inside a network namespace: one helper for the whole agent.

`in_netns(netns, fn)` runs fn in a throwaway thread that setns()es itself (setns moves only the calling
thread, and a thread's namespace dies with it), so nothing is forked and the agent's own threads stay where
they are. `netns_argv` prefixes a command line with `ip netns exec`. setns is libc's, not a raw syscall
number, so nothing here is specific to one architecture.
"""
from __future__ import annotations

import ctypes
import os
import threading

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def ns_path(netns: str) -> str:
    """The file of a namespace reference: a name under /run/netns (the ones pathprof and `ip netns` make), or
    a path such as /proc/PID/ns/net (a namespace someone else made, found by path discovery)."""
    return netns if netns.startswith("/") else f"/run/netns/{netns}"


def netns_argv(netns: str | None, argv: list[str]) -> list[str]:
    """argv run inside `netns` (None = the caller's namespace; a name or a /proc/PID/ns/net path)."""
    if not netns:
        return list(argv)
    if netns.startswith("/"):
        return ["nsenter", f"--net={netns}", *argv]
    return ["ip", "netns", "exec", netns, *argv]


def enter(netns: str) -> None:
    """Move the calling thread into the namespace (a name or a path, ns_path); OSError on failure."""
    fd = os.open(ns_path(netns), os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"setns into {netns}: {os.strerror(e)}")
    finally:
        os.close(fd)


def in_netns(netns: str | None, fn, timeout_s: float | None = None):
    """fn() run in a thread inside `netns` (None: in this thread); its result, or its exception re-raised."""
    if not netns:
        return fn()
    box: dict = {}

    def worker():
        try:
            enter(netns)
            box["value"] = fn()
        except BaseException as e:   # handed to the caller
            box["error"] = e

    t = threading.Thread(target=worker, name=f"pp-netns-{netns}", daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        raise TimeoutError(f"{netns}: no answer within {timeout_s} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")
