"""The probes front end: load and attach pathprof's BPF objects, follow the run's processes, read the
in-kernel aggregates into DataFrames (see pathprof.analysis.views for what they mean).

    session = ProbeSession(ProbeConfig(level="basic", netns=[None], service_ports=[5432], postgres_bin=...))
    session.start(); session.track(pid, "pgbench"); session.reset(); ...; result = session.stop()
"""
from __future__ import annotations

import ctypes as C
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from pathprof.agent.errors import UserError

HIST_SLOTS = 128   # probes/common.h PP_HIST_SLOTS
PROBES_DIR = Path(__file__).resolve().parent.parent / "probes"
TRACEFS = "/sys/kernel/tracing"
LEVELS = ("off", "basic", "deep")
# (program pair prefix, USDT probe base name) on provider "postgresql"
USDT_PAIRS = [("query", "query"), ("parse", "query__parse"), ("plan", "query__plan"), ("execute", "query__execute"),
              ("lock", "lock__wait"), ("lwlock", "lwlock__wait")]


def _probes_dir() -> Path:
    try:
        import pathprof.probes as pp
        return Path(pp.__file__).resolve().parent
    except Exception:  # pragma: no cover
        return PROBES_DIR


@dataclass
class ProbeConfig:
    level: str = "basic"
    netns: list = field(default_factory=lambda: [None])
    service_ports: list = field(default_factory=list)
    postgres_bin: str = "/usr/lib/postgresql/15/bin/postgres"
    trace_sample: int = 0


@dataclass
class ProbeResult:
    stages: pd.DataFrame
    cpu: pd.DataFrame
    cost: dict
    lost: dict
    traces: pd.DataFrame | None = None
    counters: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)


def ensure_tracefs() -> None:
    """Mount tracefs at /sys/kernel/tracing when it is not (libbpf's tracepoint attach reads it)."""
    if os.path.exists(f"{TRACEFS}/events"):
        return
    rc = os.system(f"mount -t tracefs tracefs {TRACEFS} >/dev/null 2>&1")
    if rc or not os.path.exists(f"{TRACEFS}/events"):
        raise UserError(f"tracefs is not mounted at {TRACEFS} and mounting it failed (are you root?)")


def read_cpu_busy_ns() -> tuple[int, int]:
    """(busy, total) CPU ns since boot from /proc/stat's cpu line; busy = total - idle - iowait."""
    with open("/proc/stat") as f:
        vals = [int(x) for x in f.readline().split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    total = sum(vals[:8])          # guest/guest_nice are already inside user/nice
    busy = total - vals[3] - vals[4]
    return busy * 10**9 // hz, total * 10**9 // hz


def _threads_and_children(pid: int) -> list[int]:
    """pid's threads, then (recursively) its child processes' threads."""
    out, todo, seen = [], [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{p}/task")]
        except OSError:
            continue
        out += tids
        for t in tids:
            try:
                todo += [int(c) for c in Path(f"/proc/{p}/task/{t}/children").read_text().split()]
            except OSError:
                pass
    return out


class ProbeSession:
    def __init__(self, config: ProbeConfig):
        if config.level not in LEVELS:
            raise UserError(f"--probes must be one of {', '.join(LEVELS)}, not {config.level!r}")
        self.config = config
        self.main = self.nf = None
        self.hops: dict[str, int] = {}
        self.netns_names: dict[int, str] = {}
        self.notes: list[str] = []
        self._stats_fd = None
        self._base: dict = {}
        self.started = False

    # ---------------- lifecycle ----------------
    def start(self) -> None:
        if self.config.level == "off" or self.started:
            return
        from pathprof.agent.bpf.libbpf import (BPF_NETFILTER, BPF_PROG_TYPE_NETFILTER, NF_HOOKS, NF_PRI_FIRST,
                                               NF_PRI_LAST, BpfError, BpfObject, enable_stats)
        ensure_tracefs()
        d = _probes_dir()
        ports = (C.c_uint16 * 8)(*sorted(set(int(p) for p in self.config.service_ports))[:8])
        deep = self.config.level == "deep"
        try:
            inos = self._netns_inodes()
            self.main = BpfObject(str(d / "pathprof.bpf.o"))
            self.main.set_rodata(svc_ports=ports, nf_netns=inos)
            for name, prog in self.main.programs.items():
                prog.set_autoload(deep or not name.startswith("pg_"))
            self.main.load()
            for name, prog in self.main.programs.items():
                if not name.startswith("pg_"):
                    self.main.attach(name)
            if deep:
                self._attach_usdt()
            self._start_netfilter(BpfObject, d, ports, inos, BpfError, NF_HOOKS, NF_PRI_FIRST, NF_PRI_LAST,
                                  BPF_PROG_TYPE_NETFILTER, BPF_NETFILTER)
            self._stats_fd = enable_stats()
        except BaseException:
            self.close()
            raise
        self.started = True
        self.reset()

    def _attach_usdt(self) -> None:
        binary = self.config.postgres_bin
        if not binary or not os.path.exists(binary):
            self.notes.append(f"deep: postgres binary {binary!r} not found, USDT probes not attached")
            return
        for prefix, probe in USDT_PAIRS:
            for end in ("start", "done"):
                self.main.attach(f"pg_{prefix}_{end}", "usdt", -1, binary, "postgresql", f"{probe}__{end}")

    def _netns_inodes(self):
        """The topology's namespaces (None = ours) -> their inodes, in slot order (at most 7)."""
        for ns in list(dict.fromkeys(self.config.netns or [None]))[:7]:
            try:
                ino = os.stat(f"/run/netns/{ns}" if ns else "/proc/self/ns/net").st_ino & 0xFFFFFFFF
            except OSError as e:
                self.notes.append(f"netns {ns}: {e}")
                continue
            self.netns_names[ino] = ns or "root"
        return (C.c_uint32 * 8)(*self.netns_names)

    def _start_netfilter(self, BpfObject, d, ports, inos, BpfError, hooks, first, last, ptype, atype) -> None:
        self.nf = BpfObject(str(d / "nf.bpf.o"))
        for shared in ("stages", "lat", "nfagg", "zero_hist", "cpu", "cpust", "stats"):   # one set of aggregates
            self.nf.maps[shared].reuse_fd(self.main.maps[shared].fd)
        self.nf.set_rodata(svc_ports=ports, nf_netns=inos)
        for prog in self.nf.programs.values():
            prog.set_type(ptype, atype)
        self.nf.load()
        for ino, ns in list(self.netns_names.items()):
            ns = None if ns == "root" else ns
            try:
                for hook in hooks:
                    self.nf.attach_netfilter("nf_begin", hook, first, ns)
                    self.nf.attach_netfilter("nf_end", hook, last, ns)
            except (UserError, OSError) as e:     # BpfError, NetfilterLinkError
                self.notes.append(f"netfilter brackets not attached in {ns or 'root'} namespace: {e}")

    def track(self, pid: int, role: str, hop: str | None = None) -> None:
        """Follow pid (its threads and children) as `role`; forks are then followed in the kernel."""
        if not self.started:
            return
        from pathprof.agent.bpf import layout as L
        if role not in L.ROLES:
            raise UserError(f"unknown probe role {role!r} (one of {', '.join(L.ROLES)})")
        hop_id = 0
        if hop:
            hop_id = self.hops.setdefault(hop, len(self.hops) + 1)
            if hop_id >= L.MAX_HOPS:
                raise UserError(f"at most {L.MAX_HOPS - 1} distinct hops can be profiled (hop {hop!r})")
        tasks = self.main.maps["tasks"]
        for tid in _threads_and_children(int(pid)):
            key = bytes(C.c_uint32(tid))
            old = tasks.lookup(key)      # already followed (forked): keep its accumulators, they are monotonic
            t = L.Task.from_buffer_copy(old) if old else L.Task()
            t.role, t.hop = L.ROLES[role], hop_id
            try:
                tasks.update(key, bytes(t))
            except OSError as e:
                self.notes.append(f"could not track {tid} ({role}): {e}")

    def reset(self) -> None:
        """The measured interval starts now: every aggregate is a monotonic counter, so remember them."""
        if self.main is None:
            return
        self._base = self._collect()

    def snapshot(self) -> dict:
        if not self.started:
            return {}
        st = _sub(self._stats(), self._base.get("stats", {}))
        cost = _sub_prog(self._prog_stats(), self._base.get("progs", {}))
        return {"messages": st.get("messages", 0), "lost": sum(v for k, v in st.items() if k in _LOSS),
                "probe_ns": sum(v["run_time_ns"] for v in cost.values())}

    def stop(self) -> ProbeResult:
        if not self.started:
            self.close()
            return ProbeResult(_empty_stages(), _empty_cpu(), {"run_time_ns": 0, "run_cnt": 0, "programs": {}}, {},
                               notes=list(self.notes))
        try:
            now = self._collect()
            devnames = self._devnames()
        finally:
            self.close()
        base = self._base
        progs = _sub_prog(now["progs"], base.get("progs", {}))
        stats = _sub(now["stats"], base.get("stats", {}))
        cost = {"run_time_ns": sum(p["run_time_ns"] for p in progs.values()),
                "run_cnt": sum(p["run_cnt"] for p in progs.values()), "programs": progs}
        lost = {k: v for k, v in stats.items() if k in _LOSS and v}
        misses = sum(p.get("recursion_misses", 0) for p in progs.values())
        if misses:
            lost["recursion_misses"] = misses
        notes = list(self.notes)
        if lost:
            notes.append("lost/unpaired events: " + ", ".join(f"{k}={v}" for k, v in lost.items()))
        stages = self._stage_frame(now, base, devnames)
        cpu = self._cpu_frame(now, base)
        return ProbeResult(stages, cpu, cost, lost, None, counters=stats, notes=notes)

    def close(self) -> None:
        for obj in (self.nf, self.main):
            if obj is not None:
                obj.close()
        self.nf = self.main = None
        if self._stats_fd is not None:
            os.close(self._stats_fd)
            self._stats_fd = None
        self.started = False

    # ---------------- readers: raw monotonic counters ----------------
    def _collect(self) -> dict:
        from pathprof.agent.bpf import layout as L
        out = {"stats": self._stats(), "progs": self._prog_stats()}
        out["lat"] = _hist_array(self.main.maps["lat"])
        out["nf"] = _hist_array(self.main.maps["nfagg"])
        st = {}
        for k, v in self.main.maps["stages"].items():
            key = L.StageKey.from_buffer_copy(k)
            st[(key.stage, key.role, key.leg, key.hop, key.netns)] = _hist_sum(v)
        out["stages"] = st
        roles: dict[tuple, np.ndarray] = {}
        for k, v in self.main.maps["cpu"].items():
            key = L.CpuKey.from_buffer_copy(k)
            roles[(key.role, key.hop)] = roles.get((key.role, key.hop), 0) + np.frombuffer(v, np.uint64)[:6].astype(float)
        for _, v in self.main.maps["tasks"].items():
            t = L.Task.from_buffer_copy(v)
            acc = np.frombuffer(bytes(t.acc), np.uint64).astype(float)
            roles[(t.role, t.hop)] = roles.get((t.role, t.hop), 0) + acc
        out["roles"] = roles
        raw = self.main.maps["cpust"].lookup(bytes(C.c_uint32(0))) or b""
        sz = (C.sizeof(L.CpuState) + 7) & ~7
        cs = [L.CpuState.from_buffer_copy(raw, i * sz) for i in range(len(raw) // sz)]
        out["cpust"] = {"other": sum(c.other_ns for c in cs), "nf": sum(c.nf_ns for c in cs),
                        "softirq_cnt": sum(c.softirq_cnt for c in cs),
                        **{f"softirq_{w}": sum(c.softirq_ns[i] for c in cs) for i, w in enumerate(("task", "idle", "other"))}}
        return out

    def _stats(self) -> dict:
        from pathprof.agent.bpf import layout as L
        m = self.main.maps["stats"]
        out = {}
        for idx, name in L.STATS.items():
            raw = m.lookup(bytes(C.c_uint32(idx)))
            out[name] = int(np.frombuffer(raw, np.uint64).sum()) if raw else 0
        return out

    def _prog_stats(self) -> dict:
        out = {}
        for obj in (self.main, self.nf):
            for name, p in (obj.programs.items() if obj else []):
                if p.fd >= 0:
                    i = p.info()
                    out[name] = {"run_time_ns": i.run_time_ns, "run_cnt": i.run_cnt,
                                 "recursion_misses": i.recursion_misses}
        return out

    def _devnames(self) -> dict:
        """(ifindex, netns inode) -> device name, for the dev.* stages."""
        import subprocess
        out = {}
        for ino, ns in self.netns_names.items():
            argv = ["ip", "-o", "link"] if ns == "root" else ["ip", "-n", ns, "-o", "link"]
            try:
                text = subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout
            except (OSError, subprocess.SubprocessError):
                continue
            for line in text.splitlines():
                idx, name = line.split(":", 2)[:2]
                out[(int(idx), ino)] = name.strip().split("@")[0]
        return out

    # ---------------- frames ----------------
    def _stage_frame(self, now: dict, base: dict, devnames: dict) -> pd.DataFrame:
        from pathprof.agent.bpf import layout as L
        hop_names = {v: k for k, v in self.hops.items()}
        ns_by_slot = {i: n for i, n in enumerate(self.netns_names.values())}
        rows = []

        def row(kind, d, role=0, leg=0, hop="", hook="", netns="", dev=""):
            s, c, h = d
            if c > 0:
                rows.append({"kind": kind, "role": L.ROLE_NAMES.get(role, str(role)), "hop": hop,
                             "leg": L.LEGS.get(leg, ""), "hook": hook, "netns": netns, "dev": dev,
                             "count": int(c), "sum_ns": int(s), "hist": [int(x) for x in h]})

        for idx, d in now["lat"].items():
            stage, role, leg, hop = L.lat_key(idx)
            row(L.STAGES[stage], _hdiff(d, base.get("lat", {}).get(idx)), role, leg, hop_names.get(hop, ""))
        for idx, d in now["nf"].items():
            slot, hook, leg, data = L.nf_key(idx)
            row("netfilter" if data else "nf_all", _hdiff(d, base.get("nf", {}).get(idx)), 0, leg,
                hook=L.NF_HOOK_NAMES[hook], netns=ns_by_slot.get(slot, "other"))
        for (stage, role, leg, hop, netns), d in now["stages"].items():
            d = _hdiff(d, base.get("stages", {}).get((stage, role, leg, hop, netns)))
            kind = L.STAGES.get(stage, str(stage))
            if kind == "dev":
                row(kind, d, 0, leg, dev=devnames.get((hop, netns), f"if{hop}"),
                    netns=self.netns_names.get(netns, str(netns)))
            else:
                row(kind, d, role, leg, hop_names.get(hop, ""))
        for (role, hop), v in now["roles"].items():   # scheduler: run-queue wait of every wakeup/preemption
            b = base.get("roles", {}).get((role, hop), np.zeros(6))
            ns, cnt = v[3] - b[3], v[4] - b[4]
            if cnt > 0:
                rows.append({"kind": "sched_runq", "role": L.ROLE_NAMES.get(role, ""), "hop": hop_names.get(hop, ""),
                             "leg": "", "hook": "", "netns": "", "dev": "", "count": int(cnt), "sum_ns": int(ns),
                             "hist": None})
        return pd.DataFrame(rows) if rows else _empty_stages()

    def _cpu_frame(self, now: dict, base: dict) -> pd.DataFrame:
        from pathprof.agent.bpf import layout as L
        hop_names = {v: k for k, v in self.hops.items()}
        rows = []
        for (role, hop), v in now["roles"].items():
            d = v - base.get("roles", {}).get((role, hop), np.zeros(6))
            oncpu, ut, st = max(d[0], 0.0), max(d[1], 0.0), max(d[2], 0.0)
            # on-CPU time is exact (sched_switch); the user/system split is the tick-sampled utime:stime ratio
            user_share = ut / (ut + st) if ut + st > 0 else 1.0
            for comp, ns in (("user", oncpu * user_share), ("sys", oncpu * (1 - user_share))):
                rows.append({"comp": comp, "role": L.ROLE_NAMES.get(role, ""), "hop": hop_names.get(hop, ""),
                             "where": "", "ns": int(ns), "count": int(d[5])})
        c, b = now["cpust"], base.get("cpust", {})
        for where in ("task", "idle", "other"):
            rows.append({"comp": "softirq", "role": "", "hop": "", "where": where,
                         "ns": int(c[f"softirq_{where}"] - b.get(f"softirq_{where}", 0)), "count": 0})
        rows.append({"comp": "netfilter", "role": "", "hop": "", "where": "", "ns": int(c["nf"] - b.get("nf", 0)),
                     "count": 0})
        rows.append({"comp": "other", "role": "", "hop": "", "where": "", "ns": int(c["other"] - b.get("other", 0)),
                     "count": 0})
        return pd.DataFrame(rows)


def _hist_sum(raw: bytes) -> tuple:
    """Sum one per-CPU pp_hist value over CPUs -> (sum_ns, count, slots array)."""
    a = np.frombuffer(raw, np.uint64).reshape(-1, 2 + HIST_SLOTS).sum(axis=0)
    return a[0], a[1], a[2:]


def _hist_array(m) -> dict:
    """All non-empty entries of a per-CPU array of pp_hist -> {index: (sum_ns, count, slots)}."""
    out = {}
    for k, v in m.items():
        a = np.frombuffer(v, np.uint64).reshape(-1, 2 + HIST_SLOTS).sum(axis=0)
        if a[1]:
            out[int.from_bytes(k, "little")] = (a[0], a[1], a[2:])
    return out


def _hdiff(d: tuple, b: tuple | None) -> tuple:
    if b is None:
        return d
    return d[0] - b[0], d[1] - b[1], d[2] - b[2]


_LOSS = {"tasks_full", "socks_full", "stages_full", "cpu_full", "wire_unpaired", "nf_unpaired", "nf_nested_full",
         "dev_full", "proc_unpaired", "hop_overflow"}


def _sub(a: dict, b: dict) -> dict:
    return {k: v - b.get(k, 0) for k, v in a.items()}


def _sub_prog(a: dict, b: dict) -> dict:
    return {n: {k: v - b.get(n, {}).get(k, 0) for k, v in d.items()} for n, d in a.items()}


def _empty_stages() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in
                         [("kind", str), ("role", str), ("hop", str), ("leg", str), ("hook", str), ("netns", str),
                          ("dev", str), ("count", "int64"), ("sum_ns", "int64"), ("hist", object)]})


def _empty_cpu() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in
                         [("comp", str), ("role", str), ("hop", str), ("where", str), ("ns", "int64"),
                          ("count", "int64")]})
