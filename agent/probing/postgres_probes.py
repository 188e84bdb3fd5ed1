"""--probes deep: the postgres binary's USDT pairs and timed functions (probes/pg_usdt.bpf.h), attached in
each measurement window by ProbeSession.

Where the kernel has uprobe_multi links (pathprof.agent.probing.bpf.uprobe_multi), each program gets one link
for all its call sites: detaching the ~26 uprobes then takes ~0.07 s instead of ~2.9 s (bench/probe_detach),
time during which the probes stayed armed after the window had closed. Elsewhere, libbpf's per-site links.
"""
from __future__ import annotations

import os

from pathprof.errors import UserError

# (program pair prefix, exported function) timed by entry/return uprobes
UPROBE_CALLS = [("wal_flush", "XLogFlush")]
# (program pair prefix, USDT probe base name) on provider "postgresql"
USDT_PAIRS = [("query", "query"), ("parse", "query__parse"), ("plan", "query__plan"), ("execute", "query__execute"),
              ("data_read", "smgr__md__read"), ("dirty_write", "buffer__write__dirty"),
              ("wal_full", "wal__buffer__write__dirty"),
              ("lock", "lock__wait"), ("lwlock", "lwlock__wait")]
PROVIDER = "postgresql"


class PostgresProbes:
    def __init__(self, note):
        self._note = note                 # ProbeSession._note: a stage that goes missing, said once
        self.multi = False                # the deep programs are loaded for uprobe_multi links
        self._sites: dict = {}            # binary -> [(program, offsets, semaphore offsets, retprobe)]

    def prepare(self, obj) -> None:
        """Before load: expect uprobe_multi links where the kernel has them (a perf-event attach of a program
        loaded so is refused, hence decided here, once)."""
        from pathprof.agent.probing.bpf import uprobe_multi
        self.multi = uprobe_multi.supported()
        if self.multi:
            for name, prog in obj.programs.items():
                if name.startswith("pg_"):
                    prog.set_type(uprobe_multi.BPF_PROG_TYPE_KPROBE, uprobe_multi.BPF_TRACE_UPROBE_MULTI)

    def attach(self, obj, binary: str) -> list:
        """Attach every deep program to `binary` (all processes mapping it); the links, to detach with the window."""
        if not binary or not os.path.exists(binary):
            self._note(f"deep: postgres binary {binary!r} not found, USDT probes not attached")
            return []
        if self.multi:
            return [obj.attach_uprobe_multi(prog, binary, offsets, semas, retprobe=ret)
                    for prog, offsets, semas, ret in self.sites(binary)]
        out = []
        for prefix, probe in USDT_PAIRS:
            for end in ("start", "done"):
                out.append(obj.attach(f"pg_{prefix}_{end}", "usdt", -1, binary, PROVIDER, f"{probe}__{end}"))
        for prefix, func in UPROBE_CALLS:
            try:
                out.append(obj.attach_uprobe(f"pg_{prefix}_start", -1, binary, func))
                out.append(obj.attach_uprobe(f"pg_{prefix}_done", -1, binary, func, retprobe=True))
            except UserError as e:      # a build without the symbol: that stage only is missing
                self._note(f"deep: {func} not found in {binary}: backend.{prefix} not measured ({e})")
        return out

    def sites(self, binary: str) -> list:
        """(program, file offsets, semaphore offsets, retprobe) per deep program, read from the binary once: the
        USDT notes' call sites (as libbpf's USDT attach reads them) and the timed functions' entries."""
        if binary in self._sites:
            return self._sites[binary]
        from pathprof.agent.probing.bpf.elf import Elf
        from pathprof.agent.probing.bpf.libbpf import BpfError
        elf = Elf(binary)
        notes = [n for n in elf.usdt_sites() if n.provider == PROVIDER]
        out = []
        for prefix, probe in USDT_PAIRS:
            for end in ("start", "done"):
                here = [n for n in notes if n.name == f"{probe}__{end}"]
                if not here:     # as libbpf's USDT attach: a probe the binary lacks fails the window
                    raise BpfError(f"attach pg_{prefix}_{end}: no USDT {PROVIDER}:{probe}__{end} in {binary}")
                out.append((f"pg_{prefix}_{end}", [n.offset for n in here], [n.sema_offset for n in here], False))
        for prefix, func in UPROBE_CALLS:
            offset = elf.function_offset(func)
            if offset is None:   # a build without the symbol: that stage only is missing
                self._note(f"deep: {func} not found in {binary}: backend.{prefix} not measured")
                continue
            out += [(f"pg_{prefix}_start", [offset], [0], False), (f"pg_{prefix}_done", [offset], [0], True)]
        self._sites[binary] = out
        return out
