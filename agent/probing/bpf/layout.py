"""ctypes mirrors of probes/common.h and probes/pathprof.h (same names, same order), and the constants
Python shares with the BPF side (defined here once).

tests/unit/test_bpf_layout.py compares every size here with the BTF clang emitted into the .bpf.o, so the
C header stays the single definition and a drift fails a test instead of mis-reading maps.
"""
from __future__ import annotations

import ctypes as C

from pathprof.analysis.histogram import HIST_SLOTS, HIST_WORDS, slot_bounds  # noqa: F401  (one definition)

MAX_PORTS = 16              # PP_MAX_PORTS
MAX_NETNS = 16              # PP_MAX_NETNS: the last slot is "other"
NUSDT = 11

ROLES = {"pgbench": 1, "backend": 2, "postmaster": 3, "pg_aux": 4, "pooler": 5, "proxy": 6, "qemu": 7, "other": 8}
ROLE_NAMES = {v: k for k, v in ROLES.items()} | {0: "kernel"}
# PostgreSQL's auxiliary processes by kind: the pg_aux role's slot (the hop slot of hop roles), so the CPU view
# shows the WAL writer, the checkpointer, ... each as its own component
AUX_KINDS = {"checkpointer": 1, "bgwriter": 2, "walwriter": 3, "autovacuum": 4, "logger": 5, "other": 6}
AUX_NAMES = {v: k for k, v in AUX_KINDS.items()}
LEGS = {0: "", 1: "request", 2: "server", 3: "response", 4: "client"}
STAGES = {1: "wire", 2: "wakeup", 3: "runqueue", 4: "recv", 5: "queued", 6: "proc", 7: "idle_exit", 8: "dev",
          9: "block", 10: "qdisc",
          12: "pg_query", 13: "pg_parse", 14: "pg_plan", 15: "pg_execute", 16: "pg_lock", 17: "pg_lwlock",
          18: "pg_wal_flush", 19: "pg_excl", 20: "pg_data_read", 21: "pg_dirty_write", 22: "pg_wal_full",
          30: "connwait"}
STATS = {0: "tasks_full", 1: "socks_full", 2: "stages_full", 3: "cpu_full", 4: "wire_unpaired",
         5: "ready_unlearned", 6: "nf_unpaired", 7: "nf_nested_full", 8: "nf_nat", 9: "dev_overwritten",
         10: "messages", 11: "nf_packets", 12: "proc_unpaired", 13: "hop_overflow",
         14: "wire_untimed", 15: "window_edge", 16: "trace_lost", 17: "traces", 18: "dev_stale", 19: "ready_race",
         20: "switch_in_unseen", 21: "piece_superseded", 22: "piece_late",
         23: "hop_continued", 34: "setup_spans", 35: "conn_wait"}
NF_HOOK_NAMES = {0: "prerouting", 1: "input", 2: "forward", 3: "output", 4: "postrouting"}
# PP_ST_PG_EXCL's sub: the usdt index of the span that owned the time (see excl_owner() in pathprof.bpf.c)
EXCL_OWNERS = {4: "pg_lock", 5: "pg_lwlock", 6: "pg_wal_flush", 8: "pg_data_read", 9: "pg_dirty_write",
               10: "pg_wal_full"}
BLOCK_OPS = {0: "read", 1: "write", 2: "flush", 3: "discard", 5: "secure_erase", 9: "write_zeroes"}
LAT_STAGES, NROLES, NLEGS, MAX_HOPS = 7, 9, 5, 8
NF_PER_NETNS = 5 * 2 * 2


def lat_entries(hop_slots: int) -> int:
    """Entries of the `lat` array for a run with hop slots 0..hop_slots-1 (sized by what the run uses)."""
    return LAT_STAGES * NROLES * NLEGS * hop_slots


def lat_key(idx: int, hop_slots: int = MAX_HOPS) -> tuple[int, int, int, int]:
    """(stage, role, leg, hop) of a `lat` array index (inverse of span() in pathprof.bpf.c)."""
    hop, idx = idx % hop_slots, idx // hop_slots
    leg, idx = idx % NLEGS, idx // NLEGS
    role, stage = idx % NROLES, idx // NROLES
    return stage + 1, role, leg, hop


def nf_key(idx: int) -> tuple[int, int, int, bool]:
    """(netns slot, hook, leg, data-only) of an `nfagg` index (see nf_end() in nf.bpf.c)."""
    data, idx = idx % 2, idx // 2
    resp, idx = idx % 2, idx // 2
    hook, slot = idx % 5, idx // 5
    return slot, hook, 3 if resp else 1, bool(data)


class StageKey(C.Structure):
    _fields_ = [("stage", C.c_uint8), ("role", C.c_uint8), ("leg", C.c_uint8), ("sub", C.c_uint8),
                ("hop", C.c_uint32), ("netns", C.c_uint32), ("pad", C.c_uint32)]


class Hist(C.Structure):
    _fields_ = [("sum_ns", C.c_uint64), ("count", C.c_uint64), ("slots", C.c_uint64 * HIST_SLOTS)]


class CpuVal(C.Structure):
    _fields_ = [("oncpu_ns", C.c_uint64), ("utime_ns", C.c_uint64), ("stime_ns", C.c_uint64),
                ("runq_ns", C.c_uint64), ("runq_cnt", C.c_uint64), ("switches", C.c_uint64)]


class CpuState(C.Structure):
    _fields_ = [("last_switch", C.c_uint64), ("excl_at_switch", C.c_uint64), ("excl_total", C.c_uint64),
                ("softirq_start", C.c_uint64), ("nf_in_softirq", C.c_uint64), ("other_ns", C.c_uint64),
                ("softirq_ns", C.c_uint64 * 3), ("softirq_cnt", C.c_uint64), ("nf_ns", C.c_uint64),
                ("cur_tracked", C.c_uint64), ("win", C.c_uint64), ("excl_win0", C.c_uint64)]


class Task(C.Structure):
    _fields_ = [("send_ts", C.c_uint64), ("wake_ts", C.c_uint64), ("oncpu_ts", C.c_uint64),
                ("runnable_ts", C.c_uint64), ("excl_snap", C.c_uint64), ("consume_ts", C.c_uint64),
                ("last_utime", C.c_uint64), ("last_stime", C.c_uint64),
                ("usdt_ts", C.c_uint64 * NUSDT), ("io_mark", C.c_uint64), ("win", C.c_uint64), ("hop", C.c_uint32),
                ("consume_seq", C.c_uint32), ("role", C.c_uint8), ("consume_leg", C.c_uint8), ("in_send", C.c_uint8),
                ("wake_idle", C.c_uint8), ("send_seq", C.c_uint32), ("cont_ts", C.c_uint64),
                ("conn_setup", C.c_uint8),
                ("consume_setup", C.c_uint8), ("pad2", C.c_uint8 * 6)]


class Sock(C.Structure):
    _fields_ = [("ready_ts", C.c_uint64), ("consume_ts", C.c_uint64), ("hop", C.c_uint32), ("role", C.c_uint8),
                ("leg", C.c_uint8), ("setup", C.c_uint8), ("setup_msg", C.c_uint8), ("seq", C.c_uint32),
                ("copied", C.c_uint32),
                ("pend_ready", C.c_uint64), ("pend_wake", C.c_uint64), ("pend_oncpu", C.c_uint64),
                ("pend_done", C.c_uint64), ("pend_seq", C.c_uint32), ("pend_idle", C.c_uint8),
                ("pend_pad", C.c_uint8 * 3), ("owner", C.c_uint32), ("owner_pad", C.c_uint32),
                ("ready_busy", C.c_uint64), ("pend_busy", C.c_uint64)]


class Win(C.Structure):
    _fields_ = [("start_ns", C.c_uint64)]


class Trace(C.Structure):
    _fields_ = [("ts", C.c_uint64), ("dur", C.c_uint64), ("pid", C.c_uint32), ("tid", C.c_uint32),
                ("seq", C.c_uint32), ("stage", C.c_uint8), ("role", C.c_uint8), ("leg", C.c_uint8),
                ("hop", C.c_uint8)]


class DevQ(C.Structure):
    _fields_ = [("skb", C.c_uint64), ("head", C.c_uint64), ("ts", C.c_uint64), ("send_ts", C.c_uint64),
                ("ifindex", C.c_uint32), ("netns", C.c_uint32), ("leg", C.c_uint8), ("pad", C.c_uint8 * 7)]


class NfSlot(C.Structure):
    _fields_ = [("skb", C.c_uint64), ("ts", C.c_uint64), ("saddr", C.c_uint32), ("daddr", C.c_uint32),
                ("sport", C.c_uint16), ("dport", C.c_uint16), ("leg", C.c_uint8), ("data", C.c_uint8),
                ("pad", C.c_uint8 * 2)]


# C struct name -> mirror, for the layout test
MIRRORS = {"pp_stage_key": StageKey, "pp_hist": Hist, "pp_cpu_val": CpuVal,
           "pp_cpu_state": CpuState, "pp_task": Task, "pp_sock": Sock, "pp_devq": DevQ, "pp_nf_slot": NfSlot,
           "pp_win": Win, "pp_trace": Trace}
