"""The probes' ABI on the Python side: struct mirrors (ctypes), enum name tables and limits, all built from
probes/abi.json, which `make -C probes` generates from the BTF clang put into pathprof.bpf.o (probes/gen_abi.py).
Nothing here is a hand-written copy of a C layout: a field or stage added in probes/*.h reaches Python through
the build, and a stale abi.json (older than the object) is refused with the command that makes it.

Names Python adds (not in the C): AUX_KINDS (PostgreSQL's auxiliary processes by kind), NF_HOOK_NAMES,
EXCL_OWNERS and BLOCK_OPS (what a `sub` value means for a stage).
"""
from __future__ import annotations

import ctypes as C
import json
from pathlib import Path

from pathprof.analysis.histogram import HIST_SLOTS, HIST_WORDS, slot_bounds  # noqa: F401  (one definition)
from pathprof.errors import RequirementError


def _probes_dir() -> Path:
    try:
        import pathprof.probes as pp
        return Path(pp.__file__).resolve().parent
    except ImportError:
        return Path(__file__).resolve().parents[3] / "probes"


def _load_abi() -> dict:
    d = _probes_dir()
    abi, obj = d / "abi.json", d / "pathprof.bpf.o"
    if not abi.exists() or (obj.exists() and abi.stat().st_mtime < obj.stat().st_mtime):
        raise RequirementError(f"{abi} is missing or older than {obj.name}: run `make -C {d}` (it is generated "
                               "from the probes' BTF)")
    return json.loads(abi.read_text())


ABI = _load_abi()
_ENUMS = ABI["enums"]
_CTYPES = {(1, False): C.c_uint8, (2, False): C.c_uint16, (4, False): C.c_uint32, (8, False): C.c_uint64,
           (1, True): C.c_int8, (2, True): C.c_int16, (4, True): C.c_int32, (8, True): C.c_int64}
_BUILT: dict[str, type] = {}


def _ctype(m: dict):
    if m["kind"] == "int":
        return _CTYPES[(m["size"], m["signed"])]
    if m["kind"] == "array":
        return _ctype(m["elem"]) * m["count"]
    return struct(m["name"])


def struct(name: str) -> type:
    """The ctypes mirror of C struct `name`, field for field at the compiled offsets (explicit padding where the
    compiler put some), the same size as the C one."""
    if name not in _BUILT:
        spec = ABI["structs"][name]
        fields, at = [], 0
        for m in spec["members"]:
            if m["offset"] > at:
                fields.append((f"_pad{at}", C.c_uint8 * (m["offset"] - at)))
            t = _ctype(m)
            fields.append((m["name"], t))
            at = m["offset"] + C.sizeof(t)
        if spec["size"] > at:
            fields.append((f"_pad{at}", C.c_uint8 * (spec["size"] - at)))
        _BUILT[name] = type(name, (C.Structure,), {"_fields_": fields})
        assert C.sizeof(_BUILT[name]) == spec["size"], name
    return _BUILT[name]


def _names(enum: str, prefix: str, skip: tuple = ()) -> dict[int, str]:
    """value -> lower-case name without the prefix (PP_ST_IDLE_EXIT -> idle_exit)."""
    return {v: k.removeprefix(prefix).lower() for k, v in sorted(_ENUMS[enum].items(), key=lambda kv: kv[1])
            if k not in skip}


def _limit(name: str) -> int:
    return next(m["count"] for m in ABI["structs"]["pp_abi_anchor"]["members"] if m["name"] == name)


MAX_PORTS = _limit("max_ports")      # PP_MAX_PORTS
MAX_NETNS = _limit("max_netns")      # PP_MAX_NETNS: the last slot is "other"
LAT_STAGES, NROLES, NLEGS, MAX_HOPS = _limit("lat_stages"), _limit("nroles"), _limit("nlegs"), _limit("max_hops")
NF_PER_NETNS = _limit("nf_per_netns")
NUSDT = next(m["count"] for m in ABI["structs"]["pp_task"]["members"] if m["name"] == "usdt_ts")

ROLES = {name: v for v, name in _names("pp_role", "PP_ROLE_", ("PP_ROLE_NONE",)).items()}
ROLE_NAMES = {v: k for k, v in ROLES.items()} | {0: "kernel"}
# PostgreSQL's auxiliary processes by kind: the pg_aux role's slot (the hop slot of hop roles), so the CPU view
# shows the WAL writer, the checkpointer, ... each as its own component
AUX_KINDS = {"checkpointer": 1, "bgwriter": 2, "walwriter": 3, "autovacuum": 4, "logger": 5, "other": 6}
AUX_NAMES = {v: k for k, v in AUX_KINDS.items()}
LEGS = {v: ("" if name == "none" else name) for v, name in _names("pp_leg", "PP_LEG_").items()}
STAGES = _names("pp_stage", "PP_ST_")
STATS = _names("pp_stat", "PP_STAT_", ("PP_NSTATS",))
NF_HOOK_NAMES = {0: "prerouting", 1: "input", 2: "forward", 3: "output", 4: "postrouting"}
# PP_ST_PG_EXCL's sub: the usdt index of the span that owned the time (see excl_owner() in pg_usdt.bpf.h)
EXCL_OWNERS = {4: "pg_lock", 5: "pg_lwlock", 6: "pg_wal_flush", 8: "pg_data_read", 9: "pg_dirty_write",
               10: "pg_wal_full"}
BLOCK_OPS = {0: "read", 1: "write", 2: "flush", 3: "discard", 5: "secure_erase", 9: "write_zeroes"}


def lat_entries(hop_slots: int) -> int:
    """Entries of the `lat` array for a run with hop slots 0..hop_slots-1 (sized by what the run uses)."""
    return LAT_STAGES * NROLES * NLEGS * hop_slots


# The sampled spans' ring (`traces`): drained every 100 ms inside windows (agent.probing.session.poll), it must hold
# what the probes write while its reader is kept from the CPU. --trace-sample 20 on 2-client loopback wrote 91.6k
# spans in a 1-s window; 4 MB (75k of them, 56 bytes each with the header) overflowed by 2 when the reader stalled
# (CI of 333d64f): 16 MB is 3 s of that. Without sampling nothing is written: one page.
TRACE_RING_SAMPLED_BYTES = 16 << 20


def trace_ring_bytes(trace_sample: int | None) -> int:
    import mmap
    return TRACE_RING_SAMPLED_BYTES if trace_sample and trace_sample > 0 else mmap.PAGESIZE


def lat_key(idx: int, hop_slots: int = MAX_HOPS) -> tuple[int, int, int, int]:
    """(stage, role, leg, hop) of a `lat` array index (inverse of span() in pathprof.bpf.c)."""
    hop, idx = idx % hop_slots, idx // hop_slots
    leg, idx = idx % NLEGS, idx // NLEGS
    role, stage = idx % NROLES, idx // NROLES
    return stage + 1, role, leg, hop


def nf_key(idx: int) -> tuple[int, int, int, bool]:
    """(netns slot, hook, leg, data-only) of an `nfagg` index (see nf_end() in netfilter.bpf.h)."""
    data, idx = idx % 2, idx // 2
    resp, idx = idx % 2, idx // 2
    hook, slot = idx % 5, idx // 5
    return slot, hook, 3 if resp else 1, bool(data)


StageKey, Hist, CpuVal, CpuState = (struct(n) for n in ("pp_stage_key", "pp_hist", "pp_cpu_val", "pp_cpu_state"))
Task, Sock, Win, Trace, DevQ, NfSlot = (struct(n) for n in ("pp_task", "pp_sock", "pp_win", "pp_trace", "pp_devq",
                                                            "pp_nf_slot"))
# C struct name -> mirror, for the layout test
MIRRORS = {"pp_stage_key": StageKey, "pp_hist": Hist, "pp_cpu_val": CpuVal,
           "pp_cpu_state": CpuState, "pp_task": Task, "pp_sock": Sock, "pp_devq": DevQ, "pp_nf_slot": NfSlot,
           "pp_win": Win, "pp_trace": Trace}
