"""A small ctypes layer over the system libbpf.so.1 (Debian 12 ships 1.1.2).

Only what pathprof needs: open an object, set `const volatile` configuration before load, set program
types libbpf 1.1 does not know (netfilter), load with libbpf's log captured so a failure names the
program and carries the verifier's reason, attach (tp_btf, tracepoint, raw tracepoint, uprobe, USDT),
netfilter links through a raw bpf(BPF_LINK_CREATE) (libbpf 1.1 predates them), map reads (batch where
the kernel has it), ring buffers, per-program run-time statistics and BPF_PROG_TEST_RUN.
"""
from __future__ import annotations

import ctypes as C
import errno
import functools
import os
import threading

from pathprof.errors import RequirementError, UserError

BPF_PROG_TYPE_NETFILTER = 32
BPF_NETFILTER = 45
BPF_LINK_CREATE = 28
BPF_STATS_RUN_TIME = 0
NFPROTO_IPV4 = 2
NF_HOOKS = {"prerouting": 0, "input": 1, "forward": 2, "output": 3, "postrouting": 4}
NF_PRI_FIRST = -(2**31) + 1      # INT_MIN and INT_MAX themselves are refused by the kernel
NF_PRI_LAST = 2**31 - 2


class BpfError(UserError):
    """A load/attach failure; the message names the program and quotes libbpf's/the kernel's reason."""




try:
    _lib = C.CDLL("libbpf.so.1", use_errno=True)
except OSError:  # pragma: no cover - depends on the machine
    _lib = None
_libc = C.CDLL(None, use_errno=True)

_P = C.c_void_p
_PRINT_FN = C.CFUNCTYPE(C.c_int, C.c_int, C.c_char_p, C.c_void_p)
_SAMPLE_FN = C.CFUNCTYPE(C.c_int, C.c_void_p, C.c_void_p, C.c_size_t)


def _sig(name, res, *args):
    f = getattr(_lib, name)
    f.restype, f.argtypes = res, list(args)


if _lib is not None:
    for _n, _r, _a in [
        ("libbpf_set_print", _P, [_PRINT_FN]),
        ("bpf_object__open_file", _P, [C.c_char_p, _P]),
        ("bpf_object__load", C.c_int, [_P]),
        ("bpf_object__close", None, [_P]),
        ("bpf_object__btf", _P, [_P]),
        ("bpf_object__next_program", _P, [_P, _P]),
        ("bpf_object__next_map", _P, [_P, _P]),
        ("bpf_object__find_map_by_name", _P, [_P, C.c_char_p]),
        ("bpf_program__name", C.c_char_p, [_P]),
        ("bpf_program__section_name", C.c_char_p, [_P]),
        ("bpf_program__set_type", C.c_int, [_P, C.c_int]),
        ("bpf_program__set_expected_attach_type", C.c_int, [_P, C.c_int]),
        ("bpf_program__set_autoload", C.c_int, [_P, C.c_bool]),
        ("bpf_program__fd", C.c_int, [_P]),
        ("bpf_program__attach", _P, [_P]),
        ("bpf_program__attach_trace", _P, [_P]),
        ("bpf_program__attach_tracepoint", _P, [_P, C.c_char_p, C.c_char_p]),
        ("bpf_program__attach_raw_tracepoint", _P, [_P, C.c_char_p]),
        ("bpf_program__attach_uprobe_opts", _P, [_P, C.c_int, C.c_char_p, C.c_size_t, _P]),
        ("bpf_program__attach_usdt", _P, [_P, C.c_int, C.c_char_p, C.c_char_p, C.c_char_p, _P]),
        ("bpf_link__destroy", C.c_int, [_P]),
        ("bpf_map__name", C.c_char_p, [_P]),
        ("bpf_map__fd", C.c_int, [_P]),
        ("bpf_map__type", C.c_int, [_P]),
        ("bpf_map__key_size", C.c_uint32, [_P]),
        ("bpf_map__value_size", C.c_uint32, [_P]),
        ("bpf_map__max_entries", C.c_uint32, [_P]),
        ("bpf_map__set_max_entries", C.c_int, [_P, C.c_uint32]),
        ("bpf_map__initial_value", _P, [_P, C.POINTER(C.c_size_t)]),
        ("btf__find_by_name_kind", C.c_int, [_P, C.c_char_p, C.c_uint32]),
        ("btf__load_vmlinux_btf", _P, []),
        ("btf__free", None, [_P]),
        ("btf__type_by_id", _P, [_P, C.c_uint32]),
        ("btf__name_by_offset", C.c_char_p, [_P, C.c_uint32]),
        ("bpf_map_lookup_elem", C.c_int, [C.c_int, _P, _P]),
        ("bpf_map_update_elem", C.c_int, [C.c_int, _P, _P, C.c_uint64]),
        ("bpf_map_lookup_batch", C.c_int, [C.c_int, _P, _P, _P, _P, C.POINTER(C.c_uint32), _P]),
        ("bpf_obj_get_info_by_fd", C.c_int, [C.c_int, _P, C.POINTER(C.c_uint32)]),
        ("bpf_enable_stats", C.c_int, [C.c_int]),
        ("bpf_prog_test_run_opts", C.c_int, [C.c_int, _P]),
        ("ring_buffer__new", _P, [C.c_int, _SAMPLE_FN, _P, _P]),
        ("ring_buffer__consume", C.c_int, [_P]),
        ("ring_buffer__free", None, [_P]),
    ]:
        _sig(_n, _r, *_a)

# ---- libbpf's log: captured per thread (libbpf calls back in the thread that called it, and the window
# thread attaches while the main thread reads maps), so an error quotes what libbpf/the verifier said to it ----
_log = threading.local()
_vsnprintf = _libc.vsnprintf
_vsnprintf.argtypes = [C.c_char_p, C.c_size_t, C.c_char_p, C.c_void_p]
LIBBPF_WARN, LIBBPF_DEBUG = 0, 2


def _lines() -> list[str]:
    if not hasattr(_log, "lines"):
        _log.lines = []
    return _log.lines


@_PRINT_FN
def _print_cb(level, fmt, ap):  # x86_64 va_list decays to a pointer: vsnprintf can format it
    if level >= LIBBPF_DEBUG:
        return 0
    # a warning may carry the whole verifier log, whose last lines say why: room for all of it (the va_list
    # can be formatted only once)
    buf = C.create_string_buffer(4 << 20 if level == LIBBPF_WARN else 8192)
    _vsnprintf(buf, len(buf), fmt, ap)
    lines = _lines()
    lines.append(buf.value.decode(errors="replace"))
    del lines[:-400]
    return 0


def _require_lib():
    if _lib is None:
        raise RequirementError("libbpf.so.1 not found: install the Debian package libbpf1")


def _take_log() -> str:
    lines = _lines()
    text = "".join(lines)
    lines.clear()
    return text


def _reason(text: str, limit: int = 30) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return "\n".join(lines[-limit:])


def _errno_ptr(ptr, what: str):
    if not ptr:
        e = C.get_errno()
        log = _reason(_take_log(), 8)
        raise BpfError(f"{what}: {os.strerror(e) if e else 'failed'}" + (f"\n{log}" if log else ""))
    return ptr


class _BpfTestRunOpts(C.Structure):
    _fields_ = [("sz", C.c_size_t), ("data_in", _P), ("data_out", _P), ("data_size_in", C.c_uint32),
                ("data_size_out", C.c_uint32), ("ctx_in", _P), ("ctx_out", _P), ("ctx_size_in", C.c_uint32),
                ("ctx_size_out", C.c_uint32), ("retval", C.c_uint32), ("repeat", C.c_int),
                ("duration", C.c_uint32), ("flags", C.c_uint32), ("cpu", C.c_uint32), ("batch_size", C.c_uint32)]


class _UprobeOpts(C.Structure):
    """struct bpf_uprobe_opts of libbpf 1.1 (sz-versioned, so later libbpfs accept it)."""
    _fields_ = [("sz", C.c_size_t), ("ref_ctr_offset", C.c_size_t), ("bpf_cookie", C.c_uint64),
                ("retprobe", C.c_bool), ("func_name", C.c_char_p)]


class _BatchOpts(C.Structure):
    _fields_ = [("sz", C.c_size_t), ("elem_flags", C.c_uint64), ("flags", C.c_uint64)]


class _ProgInfo(C.Structure):
    """struct bpf_prog_info up to recursion_misses (uapi, append-only, so the prefix is stable)."""
    _fields_ = [("type", C.c_uint32), ("id", C.c_uint32), ("tag", C.c_uint8 * 8), ("jited_prog_len", C.c_uint32),
                ("xlated_prog_len", C.c_uint32), ("jited_prog_insns", C.c_uint64), ("xlated_prog_insns", C.c_uint64),
                ("load_time", C.c_uint64), ("created_by_uid", C.c_uint32), ("nr_map_ids", C.c_uint32),
                ("map_ids", C.c_uint64), ("name", C.c_char * 16), ("ifindex", C.c_uint32),
                ("gpl_compatible", C.c_uint32), ("netns_dev", C.c_uint64), ("netns_ino", C.c_uint64),
                ("nr_jited_ksyms", C.c_uint32), ("nr_jited_func_lens", C.c_uint32), ("jited_ksyms", C.c_uint64),
                ("jited_func_lens", C.c_uint64), ("btf_id", C.c_uint32), ("func_info_rec_size", C.c_uint32),
                ("func_info", C.c_uint64), ("nr_func_info", C.c_uint32), ("nr_line_info", C.c_uint32),
                ("line_info", C.c_uint64), ("jited_line_info", C.c_uint64), ("nr_jited_line_info", C.c_uint32),
                ("line_info_rec_size", C.c_uint32), ("jited_line_info_rec_size", C.c_uint32),
                ("nr_prog_tags", C.c_uint32), ("prog_tags", C.c_uint64), ("run_time_ns", C.c_uint64),
                ("run_cnt", C.c_uint64), ("recursion_misses", C.c_uint64)]


def num_possible_cpus() -> int:
    """CPUs a per-CPU map has a slot for (the kernel's possible mask, not os.cpu_count())."""
    text = open("/sys/devices/system/cpu/possible").read().strip()
    return sum(int(b) - int(a) + 1 if "-" in part else 1
               for part in text.split(",") for a, _, b in [part.partition("-")])


class _Handle:
    """A map or program of a BpfObject: its pointer dies with the object, and using it after is an error."""
    ptr = None
    name = ""

    def _p(self):
        if not self.ptr:
            raise BpfError(f"{self.name}: its BPF object is closed")
        return self.ptr

    def invalidate(self) -> None:
        self.ptr = None


class Map(_Handle):
    def __init__(self, ptr):
        self.ptr = ptr
        self.name = _lib.bpf_map__name(ptr).decode()

    @property
    def fd(self) -> int:
        return _lib.bpf_map__fd(self._p())

    @property
    def key_size(self) -> int:
        return _lib.bpf_map__key_size(self._p())

    @property
    def value_size(self) -> int:
        return _lib.bpf_map__value_size(self._p())

    @property
    def percpu(self) -> bool:
        return _lib.bpf_map__type(self._p()) in (5, 6, 10)   # PERCPU_HASH, PERCPU_ARRAY, LRU_PERCPU_HASH

    def _vbuf_size(self) -> int:
        if self.percpu:   # the kernel hands out one 8-byte-aligned slot per possible CPU
            return ((self.value_size + 7) & ~7) * num_possible_cpus()
        return self.value_size

    def set_max_entries(self, n: int) -> None:
        """Before load: size the map by what the run uses."""
        rc = _lib.bpf_map__set_max_entries(self._p(), int(n))
        if rc:
            raise BpfError(f"max_entries {self.name}: {os.strerror(-rc)}")

    def lookup(self, key: bytes) -> bytes | None:
        v = C.create_string_buffer(self._vbuf_size())
        if _lib.bpf_map_lookup_elem(self.fd, C.c_char_p(key), v) != 0:
            return None
        return v.raw

    def update(self, key: bytes, value: bytes, flags: int = 0) -> None:
        if _lib.bpf_map_update_elem(self.fd, C.c_char_p(key), C.c_char_p(value), flags) != 0:
            e = C.get_errno()
            raise OSError(e, f"update {self.name}: {os.strerror(e)}")

    def items(self) -> list[tuple[bytes, bytes]]:
        """All (key, value) pairs: one BPF_MAP_LOOKUP_BATCH pass where the map supports it."""
        ks, vs = self.key_size, self._vbuf_size()
        batch, out = 256, []
        keys, vals = C.create_string_buffer(ks * batch), C.create_string_buffer(vs * batch)
        token_in, token_out = None, C.create_string_buffer(max(ks, 8))
        opts = _BatchOpts(sz=C.sizeof(_BatchOpts))
        while True:
            n = C.c_uint32(batch)
            rc = _lib.bpf_map_lookup_batch(self.fd, token_in, token_out, keys, vals, C.byref(n), C.byref(opts))
            e = C.get_errno() if rc else 0
            if rc and e != errno.ENOENT:     # every map type pathprof uses has batch ops (kernel >= 5.6)
                raise OSError(e, f"batch lookup {self.name}: {os.strerror(e)}")
            raw_k, raw_v = keys.raw, vals.raw
            out += [(raw_k[i * ks:(i + 1) * ks], raw_v[i * vs:(i + 1) * vs]) for i in range(n.value)]
            if rc:   # ENOENT: that was the last batch
                return out
            token_in = C.create_string_buffer(token_out.raw)


class Program(_Handle):
    def __init__(self, ptr):
        self.ptr = ptr
        self.name = _lib.bpf_program__name(ptr).decode()
        self.section = (_lib.bpf_program__section_name(ptr) or b"").decode()

    @property
    def fd(self) -> int:
        return _lib.bpf_program__fd(self._p())

    def set_type(self, prog_type: int, attach_type: int | None = None) -> None:
        """Before load (libbpf 1.1 does not know netfilter programs by section name)."""
        rc = _lib.bpf_program__set_type(self._p(), prog_type)
        if not rc and attach_type is not None:
            rc = _lib.bpf_program__set_expected_attach_type(self._p(), attach_type)
        if rc:
            raise BpfError(f"set type of {self.name}: {os.strerror(-rc)}")

    def set_autoload(self, on: bool) -> None:
        rc = _lib.bpf_program__set_autoload(self._p(), on)
        if rc:
            raise BpfError(f"set autoload of {self.name}: {os.strerror(-rc)}")

    def info(self) -> _ProgInfo:
        info, n = _ProgInfo(), C.c_uint32(C.sizeof(_ProgInfo))
        if _lib.bpf_obj_get_info_by_fd(self.fd, C.byref(info), C.byref(n)) != 0:
            raise OSError(C.get_errno(), f"prog info {self.name}")
        return info

    def test_run(self, data: bytes, ctx: bytes | None = None, repeat: int = 1) -> int:
        """BPF_PROG_TEST_RUN: run once on `data` (and a ctx_in), return the program's return value."""
        d = C.create_string_buffer(data, len(data))
        # no packet (raw_tp, syscall programs): the kernel refuses a data pointer, even an empty one, and a
        # repeat count (they run once)
        o = _BpfTestRunOpts(sz=C.sizeof(_BpfTestRunOpts), data_in=C.cast(d, _P) if data else None,
                            data_size_in=len(data), repeat=repeat if data else 0)
        if ctx is not None:
            cb = C.create_string_buffer(ctx, len(ctx))
            o.ctx_in, o.ctx_size_in = C.cast(cb, _P), len(ctx)
        if _lib.bpf_prog_test_run_opts(self.fd, C.byref(o)) != 0:
            e = C.get_errno()
            raise OSError(e, f"test run {self.name}: {os.strerror(e)}")
        return o.retval


class Link:
    """A libbpf link (ptr) or a raw link fd (netfilter); destroy() detaches."""

    def __init__(self, ptr=None, fd: int | None = None, what: str = ""):
        self.ptr, self.fd, self.what = ptr, fd, what

    def destroy(self) -> None:
        if self.ptr:
            _lib.bpf_link__destroy(self.ptr)
            self.ptr = None
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


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

    def detach(self, links: list) -> None:
        """Destroy some of this object's links (a measurement window closing); the object stays loaded."""
        for link in reversed(links):
            link.destroy()
            if link in self.links:
                self.links.remove(link)

    def close(self) -> None:
        """Detach everything and free the object; its Map and Program handles refuse further use."""
        for link in reversed(self.links):
            link.destroy()
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
    _require_lib()
    if not _vmlinux_btf:
        _vmlinux_btf.append(_lib.btf__load_vmlinux_btf())
    btf = _vmlinux_btf[0]
    if not btf:
        return False
    return _lib.btf__find_by_name_kind(btf, f"btf_trace_{name}".encode(), BTF_KIND_TYPEDEF) > 0


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
