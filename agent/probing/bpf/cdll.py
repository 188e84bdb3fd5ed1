"""The system libbpf.so.1 through ctypes: the library, its functions' signatures, and libbpf's log captured
per thread so an error quotes what libbpf/the verifier said (pathprof.agent.probing.bpf.libbpf builds on it)."""
from __future__ import annotations

import ctypes as C
import os
import threading

from pathprof.errors import RequirementError, UserError


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
        ("bpf_program__attach_iter", _P, [_P, _P]),
        ("bpf_link__fd", C.c_int, [_P]),
        ("bpf_iter_create", C.c_int, [C.c_int]),
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
        ("bpf_map_delete_elem", C.c_int, [C.c_int, _P]),
        ("bpf_map_get_next_key", C.c_int, [C.c_int, _P, _P]),
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
