"""The minimum kernel the README states (hooks.MINIMUM_KERNEL), checked against the built objects an older kernel
loads: every BPF helper they call must have come by then, unless the call is dead code on a kernel without it
(an optional helper, set before load: hooks.OPTIONAL_HELPERS; libbpf's own USDT guard for the attach cookie), and
every instruction too (BPF atomics other than a plain add, kfunc calls, the v4 instruction set).
Each object is held to the oldest kernel hooks.object_for gives it: pathprof-510.bpf.o and conn-510.bpf.o (and the
doctor's) to MINIMUM_KERNEL, pathprof-compat.bpf.o and conn.bpf.o to 5.18 (before it, object_for takes the 510
object: sched_switch has no prev_state). A new helper in the probes fails here until it is added to the table with
the version that brought it."""
import functools
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from pathprof.agent.probing import hooks as H

PROBES = Path(__file__).resolve().parents[2] / "probes"
# Objects a kernel before 6.2 loads (pathprof.bpf.o needs 6.2's bpf_rdonly_cast anyway), with the oldest kernel
# hooks.object_for gives each
OLDEST_KERNEL = {"pathprof-510.bpf.o": H.MINIMUM_KERNEL, "conn-510.bpf.o": H.MINIMUM_KERNEL,
                 "doctor.bpf.o": H.MINIMUM_KERNEL, "pathprof-compat.bpf.o": (5, 18), "conn.bpf.o": (5, 18)}
OLD_KERNEL_OBJECTS = tuple(OLDEST_KERNEL)
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


@functools.lru_cache(maxsize=None)
def _instructions(obj: str) -> tuple[bytes, ...]:
    """The built object's instructions, 8 bytes each (skips the test when it is not built)."""
    path = PROBES / obj
    if not path.exists():
        pytest.skip(f"{obj} not built (make -C probes)")
    out = subprocess.run(["llvm-objdump", "-d", str(path)], capture_output=True, text=True, check=True).stdout
    return tuple(bytes(int(b, 16) for b in m.group(1).split())
                 for m in re.finditer(r"^\s*\d+:\s+((?:[0-9a-f]{2} ){7}[0-9a-f]{2})", out, re.M))


def _helpers_called(obj: str) -> set[int]:
    """The helper ids of the object's `call` instructions (src_reg 0; 1 is a call of a subprogram, 2 a kfunc)."""
    return {int.from_bytes(i[4:8], "little", signed=True) for i in _instructions(obj)
            if i[0] == 0x85 and i[1] >> 4 == 0}     # src_reg in the high nibble of the regs byte


@pytest.mark.skipif(shutil.which("llvm-objdump") is None, reason="llvm-objdump (package llvm) not installed")
@pytest.mark.parametrize("obj", OLD_KERNEL_OBJECTS)
def test_every_helper_an_old_kernel_loads_came_by_the_minimum_kernel_or_is_guarded(obj):
    names = _helper_names()
    called = {names.get(i, f"#{i}") for i in _helpers_called(obj)}
    assert called, "no helper call found: the disassembly's format changed"
    unknown = called - HELPER_SINCE.keys()
    assert not unknown, f"{obj} calls helpers with no version here: {sorted(unknown)} (add them to HELPER_SINCE)"
    floor = OLDEST_KERNEL[obj]
    too_new = {h: HELPER_SINCE[h] for h in called if HELPER_SINCE[h] > floor and h not in GUARDED}
    assert not too_new, f"{obj} needs Linux {max(too_new.values())} for {too_new}: past its oldest kernel {floor}"
    assert max(HELPER_SINCE[h] for h in called if h not in GUARDED) <= floor


# BPF_STX | BPF_ATOMIC, 32 and 64 bits: imm 0 is BPF_ADD without BPF_FETCH, the old BPF_XADD (Linux 3.x); any other
# (fetch-add, and/or/xor, xchg, cmpxchg) came with the v3 atomics of Linux 5.12
ATOMIC_OPCODES = {0xC3, 0xDB}
# the v4 instruction set (Linux 6.6): sign-extending loads, 32-bit-offset gotol, byte swap
V4_OPCODES = {0x81, 0x89, 0x91, 0x06, 0xD7}


@pytest.mark.skipif(shutil.which("llvm-objdump") is None, reason="llvm-objdump (package llvm) not installed")
@pytest.mark.parametrize("obj", OLD_KERNEL_OBJECTS)
def test_every_instruction_an_old_kernel_loads_came_by_its_oldest_kernel(obj):
    insns = _instructions(obj)
    assert insns, "no instruction found: the disassembly's format changed"
    fetching = [i for i in insns if i[0] in ATOMIC_OPCODES and int.from_bytes(i[4:], "little") != 0]
    kfuncs = [i for i in insns if i[0] == 0x85 and i[1] >> 4 == 2]     # call with src_reg 2 (BPF_PSEUDO_KFUNC_CALL)
    v4 = [i for i in insns if i[0] in V4_OPCODES]
    if OLDEST_KERNEL[obj] < (5, 12):
        assert not fetching, f"{obj}: {len(fetching)} BPF atomics that fetch (Linux 5.12), e.g. {fetching[0].hex()}"
    if OLDEST_KERNEL[obj] < (5, 13):
        assert not kfuncs, f"{obj}: {len(kfuncs)} kfunc calls (Linux 5.13)"
    assert not v4, f"{obj}: {len(v4)} instructions of the v4 set (Linux 6.6), e.g. {v4[0].hex()}"


def test_the_audit_sees_what_the_compat_object_has_and_the_510_object_not():
    """The atomics check is not vacuous: pathprof-compat.bpf.o does fetch (cmpxchg, xchg, fetch-add)."""
    for obj in ("pathprof-compat.bpf.o", "pathprof-510.bpf.o"):
        if not (PROBES / obj).exists() or shutil.which("llvm-objdump") is None:
            pytest.skip("objects not built")
    fetch = lambda o: sum(1 for i in _instructions(PROBES / o)   # noqa: E731
                          if i[0] in ATOMIC_OPCODES and int.from_bytes(i[4:], "little"))
    assert fetch("pathprof-compat.bpf.o") > 0 and fetch("pathprof-510.bpf.o") == 0


def test_the_minimum_is_what_the_requirements_imply():
    """kernel_shortfalls' BTF requirements end at MINIMUM_KERNEL (5.8: ring buffers); an optional helper is not a
    requirement; what 5.10 lacks (task and socket storage in tracing programs, bpf_get_current_task_btf, the
    fetching atomics) is what the 510 object does without, not a shortfall."""
    assert H.MINIMUM_KERNEL == (5, 8)
    assert not any(name.endswith(tuple(H.OPTIONAL_HELPERS)) for name, _ in H.REQUIREMENTS)
    everything = {n for n, _ in H.REQUIREMENTS}
    assert H.kernel_shortfalls(True, everything, "5.10.0-32-amd64") == []
    assert H.kernel_shortfalls(True, everything, "5.8.0") == []
    before = H.kernel_shortfalls(True, everything - {"BPF_FUNC_ringbuf_output", "BPF_MAP_TYPE_RINGBUF"}, "5.7.0")
    assert before and all("Linux 5.8" in m for m in before)
