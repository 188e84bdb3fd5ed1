"""Where to put a uprobe in an ELF64 file: USDT call sites (.note.stapsdt) and function symbols as file offsets.

A uprobe_multi link (pathprof.agent.probing.bpf.uprobe_multi) takes file offsets, which libbpf 1.1 computes
only inside bpf_program__attach_usdt/attach_uprobe_opts: this reads what they read, the same way (an address
in a PT_LOAD segment -> address - segment vaddr + segment file offset; a prelinked binary's notes are moved by
.stapsdt.base's actual address - the note's recorded base).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from pathprof.errors import UserError

PT_LOAD = 1
SHT_SYMTAB, SHT_NOTE, SHT_DYNSYM = 2, 7, 11
STT_FUNC, STT_GNU_IFUNC = 2, 10
NT_STAPSDT = 3


class ElfError(UserError):
    """Not an ELF64 little-endian file, or an address no segment maps."""


@dataclass(frozen=True)
class UsdtSite:
    provider: str
    name: str
    offset: int          # file offset of the call site's nop
    sema_offset: int     # file offset of the probe's semaphore (the kernel's ref_ctr_offset), 0 if none
    args: str            # the note's argument spec ("-4@%eax 8@-16(%rbp)"), pathprof.agent.probing.bpf.usdt


class Elf:
    def __init__(self, path: str):
        self.path = path
        with open(path, "rb") as f:
            self.data = f.read()
        d = self.data
        if d[:4] != b"\x7fELF" or d[4] != 2 or d[5] != 1:
            raise ElfError(f"{path}: not a 64-bit little-endian ELF file")
        e_phoff, e_shoff = struct.unpack_from("<QQ", d, 0x20)
        e_phentsize, e_phnum, e_shentsize, e_shnum, e_shstrndx = struct.unpack_from("<HHHHH", d, 0x36)
        # (vaddr, memsz, offset) of the loadable segments
        self.segments = []
        for i in range(e_phnum):
            p_type, _flags, p_offset, p_vaddr, _paddr, _filesz, p_memsz = struct.unpack_from(
                "<IIQQQQQ", d, e_phoff + i * e_phentsize)
            if p_type == PT_LOAD:
                self.segments.append((p_vaddr, p_memsz, p_offset))
        # name -> (type, addr, offset, size, link, entsize)
        raw = [struct.unpack_from("<IIQQQQIIQQ", d, e_shoff + i * e_shentsize) for i in range(e_shnum)]
        names = raw[e_shstrndx][4] if e_shnum else 0
        self.sections = {}
        self._by_index = []
        for (sh_name, sh_type, _fl, sh_addr, sh_offset, sh_size, sh_link, _info, _al, sh_entsize) in raw:
            entry = (sh_type, sh_addr, sh_offset, sh_size, sh_link, sh_entsize)
            self._by_index.append(entry)
            self.sections.setdefault(self._cstr(names + sh_name), entry)

    def _cstr(self, at: int) -> str:
        return self.data[at:self.data.index(b"\0", at)].decode(errors="replace")

    def file_offset(self, vaddr: int) -> int:
        for start, size, offset in self.segments:
            if start <= vaddr < start + size:
                return vaddr - start + offset
        raise ElfError(f"{self.path}: address {vaddr:#x} is in no loadable segment")

    def usdt_sites(self) -> list[UsdtSite]:
        note = self.sections.get(".note.stapsdt")
        if not note:
            return []
        base = self.sections.get(".stapsdt.base")
        d, at, end = self.data, note[2], note[2] + note[3]
        out = []
        while at + 12 <= end:
            namesz, descsz, ntype = struct.unpack_from("<III", d, at)
            name_at = at + 12
            desc_at = name_at + ((namesz + 3) & ~3)
            at = desc_at + ((descsz + 3) & ~3)
            if ntype != NT_STAPSDT or d[name_at:name_at + namesz].rstrip(b"\0") != b"stapsdt":
                continue
            pc, note_base, sema = struct.unpack_from("<QQQ", d, desc_at)
            provider, name, args = d[desc_at + 24:desc_at + descsz].split(b"\0")[:3]
            if base and note_base:        # prelink moved the binary: shift by how far .stapsdt.base moved
                pc += base[1] - note_base
                sema += base[1] - note_base if sema else 0
            out.append(UsdtSite(provider.decode(), name.decode(), self.file_offset(pc),
                                self.file_offset(sema) if sema else 0, args.decode()))
        return out

    def function_offset(self, func: str) -> int | None:
        """File offset of function `func` (.symtab first, then .dynsym), None if neither has it."""
        want = func.encode()
        for table in (".symtab", ".dynsym"):
            sec = self.sections.get(table)
            if not sec or sec[0] not in (SHT_SYMTAB, SHT_DYNSYM):
                continue
            strtab = self._by_index[sec[4]][2]
            d = self.data
            for at in range(sec[2], sec[2] + sec[3], sec[5] or 24):
                st_name, st_info, _other, st_shndx, st_value, _size = struct.unpack_from("<IBBHQQ", d, at)
                if (st_info & 0xF) not in (STT_FUNC, STT_GNU_IFUNC) or not st_shndx or not st_value:
                    continue
                if d[strtab + st_name:strtab + st_name + len(want) + 1] == want + b"\0":
                    return self.file_offset(st_value)
        return None

