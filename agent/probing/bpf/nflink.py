"""BPF netfilter links through a raw bpf(BPF_LINK_CREATE): libbpf 1.1 predates them (kernel >= 6.4).

A link attaches in the caller's network namespace, so for another namespace a short-lived thread enters it
(pathprof.agent.host.netns), creates the link and ends; the link fd is process-wide and stays valid.
"""
from __future__ import annotations

import ctypes as C
import errno
import os
import platform

from pathprof.agent.host.netns import in_netns
from pathprof.errors import UserError

BPF_NETFILTER = 45
BPF_LINK_CREATE = 28
NFPROTO_IPV4 = 2
_libc = C.CDLL(None, use_errno=True)


class NetfilterLinkError(UserError):
    """BPF_LINK_CREATE for a netfilter program failed; the message carries the kernel's reason."""


_syscall = _libc.syscall
_syscall.restype = C.c_long
# bpf(2) has no libc wrapper, and libbpf 1.1's bpf_link_create() predates netfilter links
SYS_BPF = {"x86_64": 321, "aarch64": 280, "armv7l": 386, "ppc64le": 361, "s390x": 351,
           "riscv64": 280}.get(platform.machine())


def _link_create_nf(prog_fd: int, hooknum: int, priority: int) -> int:
    if SYS_BPF is None:
        raise OSError(errno.ENOSYS, f"bpf(2) syscall number unknown on {platform.machine()}")
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
    try:
        return in_netns(netns, lambda: _link_create_nf(prog_fd, hooknum, priority))
    except OSError as e:
        where = f" in netns {netns}" if netns else ""
        raise NetfilterLinkError(f"netfilter link{where} (hook {hooknum}, priority {priority}): "
                                 f"{e.strerror or e}") from None
