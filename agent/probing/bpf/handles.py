"""Maps and programs of a BpfObject (pathprof.agent.probing.bpf.libbpf): typed handles over libbpf's pointers,
map reads (batch where the kernel has it), per-program statistics and BPF_PROG_TEST_RUN."""
from __future__ import annotations

import ctypes as C
import errno
import os

from pathprof.agent.probing.bpf.cdll import _P, BpfError, _lib


class _BpfTestRunOpts(C.Structure):
    _fields_ = [("sz", C.c_size_t), ("data_in", _P), ("data_out", _P), ("data_size_in", C.c_uint32),
                ("data_size_out", C.c_uint32), ("ctx_in", _P), ("ctx_out", _P), ("ctx_size_in", C.c_uint32),
                ("ctx_size_out", C.c_uint32), ("retval", C.c_uint32), ("repeat", C.c_int),
                ("duration", C.c_uint32), ("flags", C.c_uint32), ("cpu", C.c_uint32), ("batch_size", C.c_uint32)]


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
    def max_entries(self) -> int:
        return _lib.bpf_map__max_entries(self._p())

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

    def delete(self, key: bytes) -> bool:
        """Remove the entry under key; False when there was none."""
        return _lib.bpf_map_delete_elem(self.fd, C.c_char_p(key)) == 0

    _no_batch = False

    def items(self) -> list[tuple[bytes, bytes]]:
        """All (key, value) pairs: one BPF_MAP_LOOKUP_BATCH pass where the map supports it, else key by key."""
        if self._no_batch:
            return self._items_one_by_one()
        ks, vs = self.key_size, self._vbuf_size()
        batch, out = 256, []
        keys, vals = C.create_string_buffer(ks * batch), C.create_string_buffer(vs * batch)
        token_in, token_out = None, C.create_string_buffer(max(ks, 8))
        opts = _BatchOpts(sz=C.sizeof(_BatchOpts))
        while True:
            n = C.c_uint32(batch)
            rc = _lib.bpf_map_lookup_batch(self.fd, token_in, token_out, keys, vals, C.byref(n), C.byref(opts))
            e = C.get_errno() if rc else 0
            if rc and e in NO_BATCH and not out and token_in is None:   # per-CPU arrays before Linux 5.11
                self._no_batch = True
                return self._items_one_by_one()
            if rc and e != errno.ENOENT:     # hashes have batch ops from 5.6, arrays from 5.7, per-CPU arrays 5.11
                raise OSError(e, f"batch lookup {self.name}: {os.strerror(e)}")
            raw_k, raw_v = keys.raw, vals.raw
            out += [(raw_k[i * ks:(i + 1) * ks], raw_v[i * vs:(i + 1) * vs]) for i in range(n.value)]
            if rc:   # ENOENT: that was the last batch
                return out
            token_in = C.create_string_buffer(token_out.raw)


    def _items_one_by_one(self) -> list[tuple[bytes, bytes]]:
        """bpf_map_get_next_key and a lookup per entry (a kernel whose map type has no batch lookup)."""
        ks, out = self.key_size, []
        key, nxt = None, C.create_string_buffer(ks)
        while _lib.bpf_map_get_next_key(self.fd, key, nxt) == 0:
            k = nxt.raw
            v = self.lookup(k)
            if v is not None:
                out.append((k, v))
            key = C.create_string_buffer(k, ks)
        return out


# errno of a map type without batch ops: ENOTSUPP (the kernel's 524), EOPNOTSUPP, EINVAL
NO_BATCH = {524, errno.EOPNOTSUPP, errno.EINVAL}


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
