"""uprobe_multi links through a raw bpf(BPF_LINK_CREATE): libbpf 1.1 predates them (kernel >= 6.6).

One link carries every call site of one program in one binary. What it saves is the detach: closing a
perf-event uprobe waits for RCU grace periods once per uprobe (~110 ms each here, so ~2.8 s for the ~26
uprobes of --probes deep, during which the probes stay armed after the window closed), a uprobe_multi link
once per link. The program must have been loaded with expected_attach_type BPF_TRACE_UPROBE_MULTI, which a
perf-event attach then refuses: whether to use them is decided before load (supported()).
"""
from __future__ import annotations

import ctypes as C
import errno
import functools
import os

from pathprof.agent.probing.bpf.nflink import SYS_BPF, _syscall

BPF_PROG_LOAD = 5
BPF_LINK_CREATE = 28
BPF_PROG_TYPE_KPROBE = 2
BPF_TRACE_UPROBE_MULTI = 48
BPF_F_UPROBE_MULTI_RETURN = 1
ATTR_SIZE = 128            # a prefix of union bpf_attr; the kernel wants the bytes it does not know zero


def _bpf(cmd: int, attr) -> int:
    if SYS_BPF is None:
        return -errno.ENOSYS
    rc = _syscall(C.c_long(SYS_BPF), C.c_long(cmd), attr, C.c_long(ATTR_SIZE))
    return rc if rc >= 0 else -C.get_errno()


def _put(attr, offset: int, ctype, value) -> None:
    ctype.from_buffer(attr, offset).value = value


def link_create(prog_fd: int, path: str, offsets: list[int], ref_ctr_offsets: list[int] | None = None,
                cookies: list[int] | None = None, retprobe: bool = False, pid: int = -1) -> int:
    """A uprobe_multi link of `prog_fd` at file `offsets` of `path` (uretprobes when retprobe), for process
    `pid` only (-1: every process mapping the file); returns the link fd, raises OSError with the kernel's errno."""
    n = len(offsets)
    arrays = [(C.c_uint64 * n)(*offsets)]
    arrays.append((C.c_uint64 * n)(*ref_ctr_offsets) if ref_ctr_offsets and any(ref_ctr_offsets) else None)
    arrays.append((C.c_uint64 * n)(*cookies) if cookies and any(cookies) else None)
    cpath = C.create_string_buffer(path.encode())
    attr = (C.c_uint8 * ATTR_SIZE)()
    # link_create: prog_fd, target_fd, attach_type, flags, then uprobe_multi {path, offsets, ref_ctr_offsets,
    # cookies, cnt, flags, pid}
    _put(attr, 0, C.c_uint32, prog_fd)
    _put(attr, 8, C.c_uint32, BPF_TRACE_UPROBE_MULTI)
    _put(attr, 16, C.c_uint64, C.addressof(cpath))
    for i, arr in enumerate(arrays):
        _put(attr, 24 + 8 * i, C.c_uint64, C.addressof(arr) if arr is not None else 0)
    _put(attr, 48, C.c_uint32, n)
    _put(attr, 52, C.c_uint32, BPF_F_UPROBE_MULTI_RETURN if retprobe else 0)
    _put(attr, 56, C.c_uint32, pid if pid > 0 else 0)     # 0: no process filter
    fd = _bpf(BPF_LINK_CREATE, attr)
    if fd < 0:
        raise OSError(-fd, f"uprobe_multi link on {path} ({n} offsets): {os.strerror(-fd)}")
    return fd


def _load_probe_prog() -> int:
    """`r0 = 0; exit` as a kprobe program expecting uprobe_multi links (what libbpf's own probe loads)."""
    insns = (C.c_uint64 * 2)(0x00000000000000b7, 0x0000000000000095)
    lic = C.create_string_buffer(b"GPL")
    attr = (C.c_uint8 * ATTR_SIZE)()
    _put(attr, 0, C.c_uint32, BPF_PROG_TYPE_KPROBE)
    _put(attr, 4, C.c_uint32, 2)
    _put(attr, 8, C.c_uint64, C.addressof(insns))
    _put(attr, 16, C.c_uint64, C.addressof(lic))
    _put(attr, 68, C.c_uint32, BPF_TRACE_UPROBE_MULTI)     # expected_attach_type
    return _bpf(BPF_PROG_LOAD, attr)


@functools.lru_cache(maxsize=None)
def supported() -> bool:
    """Does this kernel create uprobe_multi links? As libbpf probes it: a link on "/" (not a regular file)
    fails with EBADF where the link type exists, EINVAL (or the program load fails) where it does not."""
    prog_fd = _load_probe_prog()
    if prog_fd < 0:
        return False
    try:
        link_create(prog_fd, "/", [0])
    except OSError as e:
        return e.errno == errno.EBADF
    finally:
        os.close(prog_fd)
    return False     # pragma: no cover - a link on "/" cannot succeed
