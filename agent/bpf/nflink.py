"""BPF netfilter links through a raw bpf(BPF_LINK_CREATE): libbpf 1.1 predates them (kernel >= 6.4).

A link attaches in the caller's network namespace, so for another namespace a short-lived thread enters it
with setns(CLONE_NEWNET) (which moves only that thread), creates the link and ends; the link fd is
process-wide and stays valid.
"""
from __future__ import annotations

import ctypes as C
import os
import threading

from pathprof.agent.errors import UserError

BPF_NETFILTER = 45
BPF_LINK_CREATE = 28
NFPROTO_IPV4 = 2
CLONE_NEWNET = 0x40000000
_libc = C.CDLL(None, use_errno=True)


class NetfilterLinkError(UserError):
    """BPF_LINK_CREATE for a netfilter program failed; the message carries the kernel's reason."""


_syscall = _libc.syscall
_syscall.restype = C.c_long
SYS_BPF, SYS_SETNS = 321, 308


def _link_create_nf(prog_fd: int, hooknum: int, priority: int) -> int:
    attr = (C.c_uint8 * 64)()
    # union bpf_attr.link_create: prog_fd, target_fd, attach_type, flags, then netfilter {pf, hooknum, priority, flags}
    C.memmove(C.addressof(attr), (C.c_uint32 * 4)(prog_fd, 0, BPF_NETFILTER, 0), 16)
    C.memmove(C.addressof(attr) + 16, (C.c_int32 * 4)(NFPROTO_IPV4, hooknum, priority, 0), 16)
    fd = _syscall(C.c_long(SYS_BPF), C.c_long(BPF_LINK_CREATE), attr, C.c_long(64))
    if fd < 0:
        e = C.get_errno()
        raise OSError(e, os.strerror(e))
    return fd


def netfilter_link(prog_fd: int, hooknum: int, priority: int, netns: str | None = None) -> int:
    """BPF_LINK_CREATE for a netfilter program; the link lives in `netns` (None = the caller's)."""
    if netns is None:
        try:
            return _link_create_nf(prog_fd, hooknum, priority)
        except OSError as e:
            raise NetfilterLinkError(f"netfilter link (hook {hooknum}, priority {priority}): {e.strerror}") from None
    result: dict = {}

    def worker():   # setns(CLONE_NEWNET) moves only this thread; it ends right after
        try:
            nsfd = os.open(f"/run/netns/{netns}", os.O_RDONLY)
            try:
                if _syscall(C.c_long(SYS_SETNS), C.c_long(nsfd), C.c_long(CLONE_NEWNET)) != 0:
                    raise OSError(C.get_errno(), "setns")
            finally:
                os.close(nsfd)
            result["fd"] = _link_create_nf(prog_fd, hooknum, priority)
        except OSError as e:
            result["err"] = e

    t = threading.Thread(target=worker, name=f"pp-netns-{netns}")
    t.start()
    t.join()
    if "err" in result:
        e = result["err"]
        raise NetfilterLinkError(f"netfilter link in netns {netns} (hook {hooknum}): {e.strerror or e}")
    return result["fd"]


