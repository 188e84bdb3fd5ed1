"""The minimum kernel the README states (hooks.MINIMUM_KERNEL), checked against the built objects an older kernel
loads: every BPF helper they call must have come by then, unless the call is dead code on a kernel without it
(an optional helper, set before load: hooks.OPTIONAL_HELPERS; libbpf's own USDT guard for the attach cookie).
A new helper in the probes fails here until it is added to the table with the version that brought it."""
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from pathprof.agent.probing import hooks as H

PROBES = Path(__file__).resolve().parents[2] / "probes"
# Objects a kernel before 6.2 loads (pathprof.bpf.o needs 6.2's bpf_rdonly_cast anyway)
OLD_KERNEL_OBJECTS = ("pathprof-compat.bpf.o", "conn.bpf.o", "doctor.bpf.o")
# helper -> the Linux version from which a tracing program (tp_btf, fentry/fexit, iter) may call it
HELPER_SINCE = {
    "map_lookup_elem": (3, 19), "map_update_elem": (3, 19), "map_delete_elem": (3, 19), "ktime_get_ns": (4, 1),
    "get_smp_processor_id": (4, 1), "get_current_pid_tgid": (4, 2), "get_current_comm": (4, 2),
    "get_current_task": (4, 8), "probe_read_user": (5, 5), "probe_read_kernel": (5, 5),
    "probe_read_kernel_str": (5, 5), "ringbuf_output": (5, 8), "ringbuf_reserve": (5, 8), "ringbuf_submit": (5, 8),
    "ringbuf_discard": (5, 8), "ktime_get_boot_ns": (5, 8), "skc_to_tcp_sock": (5, 9),
    "sk_storage_get": (5, 11),            # from tracing programs (5.2 for networking ones)
    "sk_storage_delete": (5, 11), "task_storage_get": (5, 11), "task_storage_delete": (5, 11),
    "get_current_task_btf": (5, 11), "get_attach_cookie": (5, 15), "skc_to_unix_sock": (5, 16),
}
GUARDED = {"skc_to_unix_sock": "unix_peer_ok (hooks.OPTIONAL_HELPERS)",
           "get_attach_cookie": "libbpf's usdt.bpf.h: LINUX_HAS_BPF_COOKIE, else its IP-to-spec map (--probes deep)"}


def _helper_names() -> dict[int, str]:
    text = (PROBES / "vmlinux.h").read_text()
    return {int(n): name for name, n in re.findall(r"\bBPF_FUNC_([a-z0-9_]+) = (\d+),", text)}


def _helpers_called(obj: Path) -> set[int]:
    """The helper ids of the object's `call` instructions (src_reg 0; 1 is a call of a subprogram, 2 a kfunc)."""
    out = subprocess.run(["llvm-objdump", "-d", str(obj)], capture_output=True, text=True, check=True).stdout
    ids = set()
    for m in re.finditer(r":\s+85 ([0-9a-f]{2}) 00 00 ([0-9a-f]{2}) ([0-9a-f]{2}) ([0-9a-f]{2}) ([0-9a-f]{2})", out):
        if int(m.group(1), 16) & 0xF0 == 0:          # src_reg in the high nibble of the regs byte
            ids.add(int.from_bytes(bytes(int(m.group(i), 16) for i in range(2, 6)), "little", signed=True))
    return ids


@pytest.mark.skipif(shutil.which("llvm-objdump") is None, reason="llvm-objdump (package llvm) not installed")
@pytest.mark.parametrize("obj", OLD_KERNEL_OBJECTS)
def test_every_helper_an_old_kernel_loads_came_by_the_minimum_kernel_or_is_guarded(obj):
    path = PROBES / obj
    if not path.exists():
        pytest.skip(f"{obj} not built (make -C probes)")
    names = _helper_names()
    called = {names.get(i, f"#{i}") for i in _helpers_called(path)}
    assert called, "no helper call found: the disassembly's format changed"
    unknown = called - HELPER_SINCE.keys()
    assert not unknown, f"{obj} calls helpers with no version here: {sorted(unknown)} (add them to HELPER_SINCE)"
    too_new = {h: HELPER_SINCE[h] for h in called if HELPER_SINCE[h] > H.MINIMUM_KERNEL and h not in GUARDED}
    assert not too_new, f"{obj} needs Linux {max(too_new.values())} for {too_new}: past the stated minimum"
    assert max(HELPER_SINCE[h] for h in called if h not in GUARDED) <= H.MINIMUM_KERNEL


def test_the_minimum_is_what_the_requirements_imply():
    """kernel_shortfalls' BTF requirements and its version check for the atomics end at MINIMUM_KERNEL; an
    optional helper is not a requirement."""
    assert H.MINIMUM_KERNEL == (5, 12)
    assert not any(name.endswith(tuple(H.OPTIONAL_HELPERS)) for name, _ in H.REQUIREMENTS)
    assert H.kernel_shortfalls(True, {n for n, _ in H.REQUIREMENTS}, "5.12.0") == []
    assert H.kernel_shortfalls(True, {n for n, _ in H.REQUIREMENTS}, "5.11.22") != []
