"""Where the uprobe_multi links go (bpf/elf.py): the same call sites, semaphores and symbols readelf reports,
as file offsets; and the USDT programs those links carry read no arguments (a uprobe_multi link has no
argument spec behind it, libbpf's USDT links do)."""
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from pathprof.agent.probing.bpf.elf import Elf, ElfError

POSTGRES = "/usr/lib/postgresql/15/bin/postgres"
PROBES = Path(__file__).resolve().parents[2] / "probes"


def _readelf(*args) -> str:
    if not shutil.which("readelf") or not Path(POSTGRES).exists():
        pytest.skip("needs readelf and PostgreSQL 15")
    return subprocess.run(["readelf", "-W", *args, POSTGRES], capture_output=True, text=True, check=True).stdout


def _to_offset(vaddr: int) -> int:
    """readelf's program headers: a vaddr's file offset, computed independently of elf.py."""
    for m in re.finditer(r"^\s*LOAD\s+(0x\w+)\s+(0x\w+)\s+0x\w+\s+0x\w+\s+(0x\w+)", _readelf("-l"), re.M):
        off, va, memsz = (int(x, 16) for x in m.groups())
        if va <= vaddr < va + memsz:
            return vaddr - va + off
    raise AssertionError(hex(vaddr))


def test_usdt_sites_match_readelf():
    notes = re.findall(r"Provider: (\S+)\s+Name: (\S+)\s+Location: (0x\w+), Base: 0x\w+, Semaphore: (0x\w+)",
                       _readelf("-n"))
    want = sorted((p, n, _to_offset(int(loc, 16)), _to_offset(int(sem, 16)) if int(sem, 16) else 0)
                  for p, n, loc, sem in notes)
    got = sorted((s.provider, s.name, s.offset, s.sema_offset) for s in Elf(POSTGRES).usdt_sites())
    assert len(got) > 50 and got == want
    assert all(s.args is not None for s in Elf(POSTGRES).usdt_sites())


def test_function_offset_matches_readelf():
    m = re.search(r"^\s*\d+: (\w+)\s+\d+ FUNC\s+GLOBAL\s+DEFAULT\s+\d+ XLogFlush$", _readelf("-s"), re.M)
    assert Elf(POSTGRES).function_offset("XLogFlush") == _to_offset(int(m.group(1), 16))
    assert Elf(POSTGRES).function_offset("NoSuchFunctionAnywhere") is None


def test_not_an_elf_file_is_a_user_error(tmp_path):
    (tmp_path / "x").write_text("#!/bin/sh\n")
    with pytest.raises(ElfError, match="not a 64-bit"):
        Elf(str(tmp_path / "x"))


def test_usdt_programs_read_no_arguments():
    src = "".join(p.read_text() for p in [*PROBES.glob("*.bpf.c"), *PROBES.glob("*.bpf.h")])
    declared = re.findall(r"BPF_USDT\(([^)]*)\)", src)
    assert declared and all("," not in d for d in declared), declared
    assert not re.search(r"bpf_usdt_(arg|arg_cnt|cookie)\s*\(", src)
