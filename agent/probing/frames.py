"""Readers of the probes' in-kernel aggregates (raw monotonic counters) and the DataFrames built from two
readings of them (see pathprof.analysis.stages for what the rows mean). Split out of session.py, which keeps
the session's life cycle (load, windows, track, stop)."""
from __future__ import annotations

import ctypes as C
import subprocess

import numpy as np
import pandas as pd
from pathprof.agent.host.netns import netns_argv
from pathprof.agent.probing.bpf.layout import HIST_WORDS

# stats that mean something was not measured (shown as lost events); window_edge is reported apart
LOSS = {"tasks_full", "socks_full", "stages_full", "cpu_full", "wire_unpaired", "nf_unpaired", "nf_nested_full",
        "dev_overwritten", "dev_stale", "ready_race", "switch_in_unseen", "proc_unpaired", "hop_overflow",
        "trace_lost"}


def collect(main, objs=None) -> dict:
    """One reading of every aggregate. Each is a monotonic per-CPU sum kept in an array (nothing is folded
    from per-thread state at exit), so a thread that exits between two reads loses nothing."""
    from pathprof.agent.probing.bpf import layout as L
    out = {"stats": read_stats(main), "progs": prog_stats(objs or (main,))}
    out["lat"] = hist_array(main.maps["lat"])
    out["nf"] = hist_array(main.maps["nfagg"])
    st = {}
    for k, v in main.maps["stages"].items():
        key = L.StageKey.from_buffer_copy(k)
        st[(key.stage, key.role, key.leg, key.hop, key.netns, key.sub)] = hist_sum(v)
    out["stages"] = st
    roles: dict[tuple, np.ndarray] = {}
    for k, v in main.maps["cpuacc"].items():
        a = np.frombuffer(v, np.uint64).reshape(-1, C.sizeof(L.CpuVal) // 8).sum(axis=0).astype(float)
        if a.any():
            idx = int.from_bytes(k, "little")
            roles[(idx // L.MAX_HOPS, idx % L.MAX_HOPS)] = a
    out["roles"] = roles
    raw = main.maps["cpust"].lookup(bytes(C.c_uint32(0))) or b""
    sz = (C.sizeof(L.CpuState) + 7) & ~7
    cs = [L.CpuState.from_buffer_copy(raw, i * sz) for i in range(len(raw) // sz)]
    out["cpust"] = {"other": sum(c.other_ns for c in cs), "nf": sum(c.nf_ns for c in cs),
                    "softirq_cnt": sum(c.softirq_cnt for c in cs),
                    "idle": sum(c.idle_ns for c in cs), "idle_cnt": sum(c.idle_cnt for c in cs),
                    **{f"softirq_{w}": sum(c.softirq_ns[i] for c in cs)
                       for i, w in enumerate(("task", "idle", "other"))}}
    return out


def read_stats(main, only: tuple[str, ...] = ()) -> dict:
    """The stats counters (summed over CPUs), or `only` those: a lookup each (in a TCG guest ~1 ms apiece, so the
    calibration reads only `messages`, agent.probing.cost)."""
    from pathprof.agent.probing.bpf import layout as L
    m = main.maps["stats"]
    out = {}
    for idx, name in L.STATS.items():
        if only and name not in only:
            continue
        raw = m.lookup(bytes(C.c_uint32(idx)))
        out[name] = int(np.frombuffer(raw, np.uint64).sum()) if raw else 0
    return out


def prog_stats(objs) -> dict:
    out = {}
    for obj in objs:
        for name, p in (obj.programs.items() if obj else []):
            if p.fd >= 0:
                i = p.info()
                out[name] = {"run_time_ns": i.run_time_ns, "run_cnt": i.run_cnt,
                             "recursion_misses": i.recursion_misses}
    return out


def devnames(netns_names: dict) -> dict:
    """(ifindex, netns inode) -> device name, for the dev.*, qdisc.* and delay.* stages."""
    out = {}
    for ino, ns in netns_names.items():
        argv = netns_argv(None if ns == "root" else ns, ["ip", "-o", "link"])
        try:
            text = subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        for line in text.splitlines():
            idx, name = line.split(":", 2)[:2]
            out[(int(idx), ino)] = name.strip().split("@")[0]
    return out


def block_name(dev: int) -> str:
    """A kernel dev_t (major << 20 | minor) as its device name (/sys/dev/block), else MAJ:MIN."""
    major, minor = dev >> 20, dev & 0xFFFFF
    try:
        for line in open(f"/sys/dev/block/{major}:{minor}/uevent"):
            if line.startswith("DEVNAME="):
                return line.split("=", 1)[1].strip()
    except OSError:
        pass
    return f"{major}:{minor}"


def stage_frame(now: dict, base: dict, devs: dict, hops: dict, netns_names: dict, hop_slots: int) -> pd.DataFrame:
    from pathprof.agent.probing.bpf import layout as L
    hop_names = {v: k for k, v in hops.items()}
    ns_by_slot = {i: n for i, n in enumerate(netns_names.values())}
    rows = []

    def row(kind, d, role=0, leg=0, hop="", hook="", netns="", dev=""):
        s, c, h = d
        if c > 0:
            rows.append({"kind": kind, "role": L.ROLE_NAMES.get(role, str(role)), "hop": hop,
                         "leg": L.LEGS.get(leg, ""), "hook": hook, "netns": netns, "dev": dev,
                         "count": int(c), "sum_ns": int(s), "hist": [int(x) for x in h]})

    for idx, d in now["lat"].items():
        stage, role, leg, hop = L.lat_key(idx, hop_slots)
        row(L.STAGES[stage], hdiff(d, base.get("lat", {}).get(idx)), role, leg, hop_names.get(hop, ""))
    for idx, d in now["nf"].items():
        slot, hook, leg, data = L.nf_key(idx)
        row("netfilter" if data else "nf_all", hdiff(d, base.get("nf", {}).get(idx)), 0, leg,
            hook=L.NF_HOOK_NAMES[hook], netns=ns_by_slot.get(slot, "other"))
    for (stage, role, leg, hop, netns, sub), d in now["stages"].items():
        d = hdiff(d, base.get("stages", {}).get((stage, role, leg, hop, netns, sub)))
        kind = L.STAGES.get(stage, str(stage))
        if kind == "block":
            row(kind, d, 0, 0, hook=L.BLOCK_OPS.get(sub, f"op{sub}"), dev=block_name(hop))
            continue
        if kind == "retx_count":     # retransmissions by outgoing leg; their kind in `hook`
            row(kind, d, role, leg, hop_names.get(hop, ""), hook={1: "rto", 2: "fast", 3: "probe"}.get(sub, "other"))
            continue
        if kind == "setup_retx":     # -C: a setup message's retransmission wait, by where it falls, in `hook`
            row(kind, d, role, leg, hop_names.get(hop, ""), hook={1: "init", 2: "hello"}.get(sub, "other"))
            continue
        if kind == "pg_excl":        # exclusive part of a backend wait/I-O: named by its owner, in `hook`
            row(kind, d, role, leg, hop_names.get(hop, ""), hook=L.EXCL_OWNERS.get(sub, f"u{sub}"))
            continue
        if kind in ("dev", "qdisc"):              # qdisc sub 1: held by the link's delay line (topologies.impairments)
            kind = "delay" if kind == "qdisc" and sub == 1 else kind
            row(kind, d, 0, leg, dev=devs.get((hop, netns), f"if{hop}"), netns=netns_names.get(netns, str(netns)))
        else:
            row(kind, d, role, leg, hop_names.get(hop, ""))
    for (role, hop), v in now["roles"].items():   # scheduler: run-queue wait of every wakeup/preemption
        b = base.get("roles", {}).get((role, hop), np.zeros(len(v)))
        # (runq_ns, runq_cnt) and (thr_ns, thr_cnt): struct pp_cpu_val's fields 3-4 and 6-7
        for kind, i in (("sched_runq", 3), ("sched_throttled", 6)):
            ns, cnt = (v[i] - b[i], v[i + 1] - b[i + 1]) if len(v) > i + 1 else (0, 0)
            if cnt > 0:
                rows.append({"kind": kind, "role": L.ROLE_NAMES.get(role, ""), "hop": hop_names.get(hop, ""),
                             "leg": "", "hook": "", "netns": "", "dev": "", "count": int(cnt), "sum_ns": int(ns),
                             "hist": None})
    return pd.DataFrame(rows) if rows else empty_stages()


def idle_wakeups_ns(idle_task_ns: float, asleep_ns: float) -> float:
    """The CPUs' work of waking from idle: the idle tasks' on-CPU time (NET softirq and netfilter inside it
    carved out, they are components of their own) less the time the CPUs slept in the no-HZ idle state (idle +
    iowait). What is left ran on no task: the idle loop leaving and re-entering sleep, and the interrupts and
    other softirqs (timers, RCU, IPIs) an idle CPU woke for. Never negative: the window's edges can make the
    sleep a little longer than the idle tasks' time measured inside it."""
    return max(float(idle_task_ns) - float(asleep_ns), 0.0)


def idle_task(now: dict, base: dict) -> tuple[float, int]:
    """(on-CPU ns, switches out) of the CPUs' idle tasks between two readings."""
    c, b = now["cpust"], base.get("cpust", {})
    return c.get("idle", 0) - b.get("idle", 0), int(c.get("idle_cnt", 0) - b.get("idle_cnt", 0))


def cpu_frame(now: dict, base: dict, hops: dict, asleep_ns: float | None = None) -> pd.DataFrame:
    """The CPU table between two readings. asleep_ns: the CPUs' no-HZ sleep over the same interval
    (agent.host.machine.cpu_times); given, the row `idle` is the work of waking from idle (idle_wakeups_ns),
    the part of the busy time no task carries."""
    from pathprof.agent.probing.bpf import layout as L
    hop_names = {v: k for k, v in hops.items()}
    rows = []
    for (role, hop), v in now["roles"].items():
        d = v - base.get("roles", {}).get((role, hop), np.zeros(len(v)))
        oncpu, ut, st = max(d[0], 0.0), max(d[1], 0.0), max(d[2], 0.0)
        # on-CPU time is exact (sched_switch); the user/system split is the tick-sampled utime:stime ratio
        user_share = ut / (ut + st) if ut + st > 0 else 1.0
        name = L.ROLE_NAMES.get(role, "")
        if name == "pg_aux" and hop:           # the slot is the auxiliary process's kind, not a hop
            name, hop = f"pg_aux.{L.AUX_NAMES.get(hop, 'other')}", 0
        for comp, ns in (("user", oncpu * user_share), ("sys", oncpu * (1 - user_share))):
            rows.append({"comp": comp, "role": name, "hop": hop_names.get(hop, ""),
                         "where": "", "ns": int(ns), "count": int(d[5])})
    c, b = now["cpust"], base.get("cpust", {})
    for where in ("task", "idle", "other"):
        rows.append({"comp": "softirq", "role": "", "hop": "", "where": where,
                     "ns": int(c[f"softirq_{where}"] - b.get(f"softirq_{where}", 0)), "count": 0})
    rows.append({"comp": "netfilter", "role": "", "hop": "", "where": "", "ns": int(c["nf"] - b.get("nf", 0)),
                 "count": 0})
    rows.append({"comp": "other", "role": "", "hop": "", "where": "", "ns": int(c["other"] - b.get("other", 0)),
                 "count": 0})
    if asleep_ns is not None:
        idle_ns, wakeups = idle_task(now, base)
        rows.append({"comp": "idle", "role": "", "hop": "", "where": "",
                     "ns": int(idle_wakeups_ns(idle_ns, asleep_ns)), "count": wakeups})
    return pd.DataFrame(rows)


def trace_frame(raw: list[bytes], hops: dict, client: str = "pgbench") -> pd.DataFrame:
    """Ring-buffer span records (struct pp_trace) -> the traces table pathprof.analysis.export.files reads:
    ts_ns, dur_ns, pid, tid, role, stage, txn (the per-socket message number), leg. The client's spans are named
    after `client` (role and stage: `client.sysbench`), as the report names its stages (analysis.client)."""
    from pathprof.agent.probing.bpf import layout as L
    from pathprof.analysis.client import label
    from pathprof.analysis.stages import stage_name
    hop_names = {v: k for k, v in hops.items()}
    cols = ("ts_ns", "dur_ns", "pid", "tid", "role", "stage", "txn", "leg")
    if not raw:
        return pd.DataFrame({c: pd.Series(dtype="int64" if c in ("ts_ns", "dur_ns", "pid", "tid", "txn") else str)
                             for c in cols})
    a = np.frombuffer(b"".join(raw), dtype=np.dtype(L.Trace))    # struct pp_trace, from the probes' BTF
    a = a[~np.isin(a["stage"], list(MARKER_STAGES(L)))]             # markers: message_frame
    if not len(a):
        return trace_frame([], hops, client)
    names = {}
    for key in set(zip(a["stage"].tolist(), a["role"].tolist(), a["hop"].tolist())):
        stage, role, hop = key
        r, h = L.ROLE_NAMES.get(role, str(role)), hop_names.get(hop, "")
        names[key] = (stage_name(L.STAGES.get(stage, str(stage)), r, h, client=client), h or label(r, client))
    keys = list(zip(a["stage"].tolist(), a["role"].tolist(), a["hop"].tolist()))
    df = pd.DataFrame({"ts_ns": a["ts"].astype("int64"), "dur_ns": a["dur"].astype("int64"),
                       "pid": a["pid"].astype("int64"), "tid": a["tid"].astype("int64"),
                       "role": [names[k][1] for k in keys], "stage": [names[k][0] for k in keys],
                       "txn": a["seq"].astype("int64"), "leg": [L.LEGS.get(x, "") for x in a["leg"].tolist()]})
    return df.sort_values("ts_ns", kind="stable").reset_index(drop=True)


def MARKER_STAGES(L) -> dict:
    """stage id -> direction of the message markers (PP_ST_XSEND / PP_ST_XRECV) in the trace ring buffer."""
    return {k: {"xsend": "send", "xrecv": "recv"}[v] for k, v in L.STAGES.items() if v in ("xsend", "xrecv")}


MESSAGE_COLS = ("ts_ns", "dir", "role", "leg", "txn", "pid", "tid", "local_ip", "local_port", "remote_ip",
                "remote_port", "tcp_seq")


def message_frame(raw: list[bytes], hops: dict) -> pd.DataFrame:
    """The markers of TCP messages crossing this host's edge (--trace-sample): one row per sampled message sent
    (`dir` send: the sender's send start) or delivered (recv: sk_data_ready) on this host, with the socket's own
    tuple and the TCP sequence number of the message's first byte. messages.parquet; pathprof merge joins hosts'
    runs with it (pathprof.analysis.merge)."""
    import ipaddress

    from pathprof.agent.probing.bpf import layout as L
    ints = ("ts_ns", "txn", "pid", "tid", "local_port", "remote_port", "tcp_seq")
    empty = pd.DataFrame({c: pd.Series(dtype="int64" if c in ints else str) for c in MESSAGE_COLS})
    if not raw:
        return empty
    a = np.frombuffer(b"".join(raw), dtype=np.dtype(L.Trace))
    dirs = MARKER_STAGES(L)
    a = a[np.isin(a["stage"], list(dirs))]
    if not len(a):
        return empty
    hop_names = {v: k for k, v in hops.items()}

    names: dict[int, str] = {}      # a few addresses over hundreds of thousands of markers: format each once

    def ip(x: int) -> str:
        if x not in names:
            names[x] = str(ipaddress.IPv4Address(int(x).to_bytes(4, "little")))
        return names[x]
    df = pd.DataFrame({"ts_ns": a["ts"].astype("int64"), "dir": [dirs[x] for x in a["stage"].tolist()],
                       "role": [hop_names.get(h) or L.ROLE_NAMES.get(r, str(r))
                                for r, h in zip(a["role"].tolist(), a["hop"].tolist())],
                       "leg": [L.LEGS.get(x, "") for x in a["leg"].tolist()], "txn": a["seq"].astype("int64"),
                       "pid": a["pid"].astype("int64"), "tid": a["tid"].astype("int64"),
                       "local_ip": [ip(x) for x in a["laddr"].tolist()], "local_port": a["lport"].astype("int64"),
                       "remote_ip": [ip(x) for x in a["raddr"].tolist()], "remote_port": a["rport"].astype("int64"),
                       "tcp_seq": a["tcp_seq"].astype("int64")})
    return df.sort_values("ts_ns", kind="stable").reset_index(drop=True)


def hist_sum(raw: bytes) -> tuple:
    """Sum one per-CPU pp_hist value over CPUs -> (sum_ns, count, slots array)."""
    a = np.frombuffer(raw, np.uint64).reshape(-1, HIST_WORDS).sum(axis=0)
    return a[0], a[1], a[2:]


def hist_array(m) -> dict:
    """All non-empty entries of a per-CPU array of pp_hist -> {index: (sum_ns, count, slots)}."""
    out = {}
    for k, v in m.items():
        a = np.frombuffer(v, np.uint64).reshape(-1, HIST_WORDS).sum(axis=0)
        if a[1]:
            out[int.from_bytes(k, "little")] = (a[0], a[1], a[2:])
    return out


def hdiff(d: tuple, b: tuple | None) -> tuple:
    if b is None:
        return d
    return d[0] - b[0], d[1] - b[1], d[2] - b[2]


def sub(a: dict, b: dict) -> dict:
    return {k: v - b.get(k, 0) for k, v in a.items()}


def sub_prog(a: dict, b: dict) -> dict:
    return {n: {k: v - b.get(n, {}).get(k, 0) for k, v in d.items()} for n, d in a.items()}


def empty_stages() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in
                         [("kind", str), ("role", str), ("hop", str), ("leg", str), ("hook", str), ("netns", str),
                          ("dev", str), ("count", "int64"), ("sum_ns", "int64"), ("hist", object)]})


def empty_cpu() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in
                         [("comp", str), ("role", str), ("hop", str), ("where", str), ("ns", "int64"),
                          ("count", "int64")]})
