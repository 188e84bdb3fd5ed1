"""A small ctypes layer over the system libbpf.so.1 (Debian 12 ships 1.1.2).

Only what pathprof needs: open an object, set `const volatile` configuration before load, set program
types libbpf 1.1 does not know (netfilter), load with libbpf's log captured so a failure names the
program and carries the verifier's reason, attach (tp_btf, tracepoint, raw tracepoint, uprobe, USDT),
netfilter links through a raw bpf(BPF_LINK_CREATE) (libbpf 1.1 predates them), map reads (batch where
the kernel has it), ring buffers, per-program run-time statistics and BPF_PROG_TEST_RUN.
The library and its log are in cdll.py, maps and programs in handles.py; both are re-exported here.
"""
from __future__ import annotations

import ctypes as C
import functools
import os
import threading

# _lines, _take_log, Map, Program, num_possible_cpus: re-exported (callers and tests import them from here)
from pathprof.agent.probing.bpf.cdll import (  # noqa: F401
    _SAMPLE_FN,
    BpfError,
    _errno_ptr,
    _lib,
    _lines,
    _print_cb,
    _reason,
    _require_lib,
    _take_log,
)
from pathprof.agent.probing.bpf.handles import Map, Program, num_possible_cpus  # noqa: F401
from pathprof.errors import RequirementError

BPF_PROG_TYPE_NETFILTER = 32
BPF_NETFILTER = 45
BPF_LINK_CREATE = 28
BPF_STATS_RUN_TIME = 0
NFPROTO_IPV4 = 2
NF_HOOKS = {"prerouting": 0, "input": 1, "forward": 2, "output": 3, "postrouting": 4}
NF_PRI_FIRST = -(2**31) + 1      # INT_MIN and INT_MAX themselves are refused by the kernel
NF_PRI_LAST = 2**31 - 2


class _UprobeOpts(C.Structure):
    """struct bpf_uprobe_opts of libbpf 1.1 (sz-versioned, so later libbpfs accept it)."""
    _fields_ = [("sz", C.c_size_t), ("ref_ctr_offset", C.c_size_t), ("bpf_cookie", C.c_uint64),
                ("retprobe", C.c_bool), ("func_name", C.c_char_p)]


class Link:
    """A libbpf link (ptr) or a raw link fd (netfilter, uprobe_multi); destroy() detaches."""

    def __init__(self, ptr=None, fd: int | None = None, what: str = ""):
        self.ptr, self.fd, self.what = ptr, fd, what

    def destroy(self) -> None:
        if self.ptr:
            _lib.bpf_link__destroy(self.ptr)
            self.ptr = None
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _destroy_all(links: list) -> None:
    """Destroy links, the raw-fd ones concurrently: releasing one waits for RCU grace periods (~50 ms for a
    uprobe_multi link here), and closes in flight at once share them. libbpf's own links are destroyed one by
    one (a USDT link returns its spec ids to an object-wide list)."""
    raw = [link for link in links if link.fd is not None and not link.ptr]
    threads = [threading.Thread(target=link.destroy, name="pp-detach") for link in raw[1:]]
    for t in threads:
        t.start()
    try:
        for link in [*raw[:1], *(link for link in reversed(links) if link not in raw)]:
            link.destroy()
    finally:
        for t in threads:
            t.join()


from pathprof.agent.probing.bpf import uprobe_multi  # noqa: E402  (raw BPF_LINK_CREATE, see there)
from pathprof.agent.probing.bpf.nflink import netfilter_link  # noqa: E402  (raw BPF_LINK_CREATE, see there)


class BpfObject:
    def __init__(self, path: str):
        _require_lib()
        _lib.libbpf_set_print(_print_cb)
        if not os.path.exists(path):
            raise RequirementError(f"probe object {path} is missing: run `make -C probes`")
        _take_log()
        self.path = path
        self.ptr = _errno_ptr(_lib.bpf_object__open_file(path.encode(), None), f"open {path}")
        self.programs: dict[str, Program] = {}
        p = None
        while (p := _lib.bpf_object__next_program(self.ptr, p)):
            prog = Program(p)
            self.programs[prog.name] = prog
        self.maps: dict[str, Map] = {}
        m = None
        while (m := _lib.bpf_object__next_map(self.ptr, m)):
            mp = Map(m)
            self.maps[mp.name] = mp
        self.links: list[Link] = []

    def map(self, name: str) -> Map:
        ptr = _lib.bpf_object__find_map_by_name(self.ptr, name.encode())
        if not ptr:
            raise KeyError(name)
        return Map(ptr)

    def set_rodata(self, **values) -> None:
        """Write `const volatile` globals before load, at their offsets in the .rodata DATASEC (BTF)."""
        m = self.map(".rodata")
        size = C.c_size_t()
        base = _lib.bpf_map__initial_value(m.ptr, C.byref(size))
        btf = _lib.bpf_object__btf(self.ptr)
        sec_id = _lib.btf__find_by_name_kind(btf, b".rodata", 15)   # BTF_KIND_DATASEC
        if not base or sec_id < 0:
            raise BpfError(f"{self.path}: no .rodata to configure")
        t = C.cast(_lib.btf__type_by_id(btf, sec_id), C.POINTER(C.c_uint32 * 3)).contents
        vlen = t[1] & 0xFFFF
        secinfo = C.cast(_lib.btf__type_by_id(btf, sec_id) + 12, C.POINTER(C.c_uint32 * (3 * vlen))).contents
        where = {}
        for i in range(vlen):
            var_t = C.cast(_lib.btf__type_by_id(btf, secinfo[3 * i]), C.POINTER(C.c_uint32 * 3)).contents
            name = _lib.btf__name_by_offset(btf, var_t[0]).decode()
            where[name] = (secinfo[3 * i + 1], secinfo[3 * i + 2])
        for name, val in values.items():
            if name not in where:
                raise KeyError(f"{self.path}: no const volatile {name}")
            off, sz = where[name]
            raw = bytes(val)
            if len(raw) > sz:
                raise ValueError(f"{name}: {len(raw)} bytes > {sz}")
            C.memmove(base + off, raw, len(raw))

    def load(self) -> None:
        _take_log()
        rc = _lib.bpf_object__load(self.ptr)
        if rc:
            log = _take_log()
            bad = [n for n in self.programs if f"prog '{n}'" in log]
            who = f"program {bad[0]}" if bad else os.path.basename(self.path)
            raise BpfError(f"loading {who} failed: {os.strerror(-rc)}\n{_reason(log)}")

    def attach(self, prog: str, kind: str | None = None, *args) -> Link:
        """kind: None (by section), 'tp_btf', 'tracepoint' (cat, name), 'raw_tp' (name),
        'uprobe' (pid, binary, offset), 'usdt' (pid, binary, provider, name)."""
        p = self.programs[prog]
        _take_log()
        if kind is None:
            ptr = _lib.bpf_program__attach(p.ptr)
        elif kind == "tp_btf":
            ptr = _lib.bpf_program__attach_trace(p.ptr)
        elif kind == "tracepoint":
            ptr = _lib.bpf_program__attach_tracepoint(p.ptr, args[0].encode(), args[1].encode())
        elif kind == "raw_tp":
            ptr = _lib.bpf_program__attach_raw_tracepoint(p.ptr, args[0].encode())
        elif kind == "uprobe":
            ptr = _lib.bpf_program__attach_uprobe_opts(p.ptr, args[0], args[1].encode(), args[2], None)
        elif kind == "usdt":
            ptr = _lib.bpf_program__attach_usdt(p.ptr, args[0], args[1].encode(), args[2].encode(),
                                                args[3].encode(), None)
        else:
            raise ValueError(kind)
        link = Link(ptr=_errno_ptr(ptr, f"attach {prog} ({p.section}{' ' + ' '.join(map(str, args)) if args else ''})"),
                    what=prog)
        self.links.append(link)
        return link

    def run_iter(self, prog: str) -> None:
        """Run an iterator program (iter/...) once over what it iterates: attach, read its output to the end,
        detach."""
        p = self.programs[prog]
        _take_log()
        link = _errno_ptr(_lib.bpf_program__attach_iter(p.ptr, None), f"attach {prog} ({p.section})")
        try:
            fd = _lib.bpf_iter_create(_lib.bpf_link__fd(link))
            if fd < 0:
                raise BpfError(f"{prog}: bpf_iter_create: {os.strerror(-fd)}")
            try:
                while os.read(fd, 4096):
                    pass
            finally:
                os.close(fd)
        finally:
            _lib.bpf_link__destroy(link)

    def attach_uprobe(self, prog: str, pid: int, binary: str, func: str, retprobe: bool = False) -> Link:
        """uprobe/uretprobe on `func` (libbpf resolves the symbol) in `binary`, for process `pid` only
        (-1: every process mapping the binary)."""
        p = self.programs[prog]
        _take_log()
        opts = _UprobeOpts(sz=C.sizeof(_UprobeOpts), retprobe=retprobe, func_name=func.encode())
        ptr = _lib.bpf_program__attach_uprobe_opts(p.ptr, pid, binary.encode(), 0, C.byref(opts))
        what = f"attach {prog} ({'uretprobe' if retprobe else 'uprobe'} {binary}:{func} pid {pid})"
        link = Link(ptr=_errno_ptr(ptr, what), what=prog)
        self.links.append(link)
        return link

    def attach_netfilter(self, prog: str, hook: str, priority: int, netns: str | None = None) -> Link:
        fd = netfilter_link(self.programs[prog].fd, NF_HOOKS[hook], priority, netns)
        link = Link(fd=fd, what=f"{prog}@{hook}/{netns or 'root'}")
        self.links.append(link)
        return link

    def attach_uprobe_multi(self, prog: str, binary: str, offsets: list[int], ref_ctr_offsets: list[int] | None = None,
                            retprobe: bool = False, pid: int = -1) -> Link:
        """One uprobe_multi link of `prog` at file `offsets` of `binary` (semaphores at `ref_ctr_offsets`, 0 for
        none); `prog` was loaded expecting them (uprobe_multi.BPF_TRACE_UPROBE_MULTI). No cookies: pathprof's
        USDT programs read no arguments (libbpf's cookie is the argument spec's id)."""
        try:
            fd = uprobe_multi.link_create(self.programs[prog].fd, binary, offsets, ref_ctr_offsets,
                                          retprobe=retprobe, pid=pid)
        except OSError as e:
            raise BpfError(f"attach {prog} ({'uretprobe' if retprobe else 'uprobe'}_multi {binary}, "
                           f"{len(offsets)} sites, pid {pid}): {e.strerror}") from None
        link = Link(fd=fd, what=prog)
        self.links.append(link)
        return link

    def detach(self, links: list) -> None:
        """Destroy some of this object's links (a measurement window closing); the object stays loaded."""
        _destroy_all(links)
        gone = {id(link) for link in links}
        self.links = [link for link in self.links if id(link) not in gone]

    def close(self) -> None:
        """Detach everything and free the object; its Map and Program handles refuse further use."""
        _destroy_all(self.links)
        self.links.clear()
        for h in [*self.maps.values(), *self.programs.values()]:
            h.invalidate()
        if self.ptr:
            _lib.bpf_object__close(self.ptr)
            self.ptr = None

    def __enter__(self) -> "BpfObject":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


BTF_KIND_TYPEDEF = 8


_vmlinux_btf: list = []     # the kernel's BTF, parsed once per process (tens of ms each time otherwise)


@functools.lru_cache(maxsize=None)
def kernel_has_tracepoint(name: str) -> bool:
    """Does the running kernel's BTF describe tracepoint `name` (the `btf_trace_<name>` typedef a tp_btf
    program attaches through)? No tracefs needed. The kernel does not change under a running process: cached."""
    btf = _kernel_btf()
    if not btf:
        return False
    return _lib.btf__find_by_name_kind(btf, f"btf_trace_{name}".encode(), BTF_KIND_TYPEDEF) > 0


@functools.lru_cache(maxsize=None)
def kernel_tracepoint_args(name: str) -> int | None:
    """The arguments tracepoint `name` hands a tp_btf program (its `btf_trace_<name>` prototype's, less the first,
    the tracepoint's own data pointer), None when the kernel has no such tracepoint."""
    btf = _kernel_btf()
    tid = _lib.btf__find_by_name_kind(btf, f"btf_trace_{name}".encode(), BTF_KIND_TYPEDEF) if btf else -1
    if tid <= 0:
        return None
    for _ in range(2):                       # typedef -> pointer -> function prototype
        tid = C.cast(_lib.btf__type_by_id(btf, tid), C.POINTER(C.c_uint32 * 3)).contents[2]
    info = C.cast(_lib.btf__type_by_id(btf, tid), C.POINTER(C.c_uint32 * 3)).contents[1]
    return (info & 0xFFFF) - 1


def _kernel_btf():
    _require_lib()
    if not _vmlinux_btf:
        _vmlinux_btf.append(_lib.btf__load_vmlinux_btf())
    return _vmlinux_btf[0]


def kernel_btf_find(name: str, kind: int) -> bool:
    """Is there a type `name` of BTF kind `kind` (12: a function) in the running kernel's BTF?"""
    btf = _kernel_btf()
    return bool(btf) and _lib.btf__find_by_name_kind(btf, name.encode(), kind) > 0


BTF_KIND_ENUM = 6


def kernel_enum_values(*enums: str) -> set[str]:
    """The value names of the kernel BTF's enums `enums` (bpf_func_id: the helpers this kernel has)."""
    btf = _kernel_btf()
    out: set[str] = set()
    for enum in enums if btf else ():
        tid = _lib.btf__find_by_name_kind(btf, enum.encode(), BTF_KIND_ENUM)
        if tid <= 0:
            continue
        t = _lib.btf__type_by_id(btf, tid)
        vlen = C.cast(t, C.POINTER(C.c_uint32 * 3)).contents[1] & 0xFFFF
        vals = C.cast(t + 12, C.POINTER(C.c_uint32 * (2 * vlen))).contents   # struct btf_enum {name_off, val}
        out.update(_lib.btf__name_by_offset(btf, vals[2 * i]).decode() for i in range(vlen))
    return out


def enable_stats() -> int:
    """BPF_ENABLE_STATS: run_time_ns/run_cnt are counted while the returned fd is open (no sysctl to restore)."""
    _require_lib()
    fd = _lib.bpf_enable_stats(BPF_STATS_RUN_TIME)
    if fd < 0:
        raise OSError(-fd, "bpf_enable_stats")
    return fd


class RingBuffer:
    """ring_buffer__new over one BPF_MAP_TYPE_RINGBUF; callback(bytes) per record."""

    def __init__(self, map_fd: int, callback):
        self._cb = _SAMPLE_FN(lambda ctx, data, size: (callback(C.string_at(data, size)) or 0))
        self.ptr = _errno_ptr(_lib.ring_buffer__new(map_fd, self._cb, None, None), "ring buffer")

    def consume(self) -> int:
        return _lib.ring_buffer__consume(self.ptr)

    def free(self) -> None:
        if self.ptr:
            _lib.ring_buffer__free(self.ptr)
            self.ptr = None
