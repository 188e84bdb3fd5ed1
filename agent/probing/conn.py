"""Front end of probes/conn.bpf.c: the connection-setup split of runs that open a connection per transaction.

    probe = ConnProbe(postmaster_pid, [5432])
    probe.start(); probe.track_client(pgbench_pid); probe.reset(); ...; frame = probe.stop(); probe.cost()

Its own object, separate from ProbeSession (pathprof.agent.probing.session): it is only loaded for --connect runs and
costs nothing per message, only per connection (a handful of events each). The frame has one row per step
(kind "latency" or "cpu", see pathprof.analysis.conn_view for the names and what they mean) plus one row per
counter (kind "stat": connection starts, matches, unmatched and lost events), so connect.parquet alone says
how complete the split is.
"""
from __future__ import annotations

import ctypes as C
import os
import time
from pathlib import Path

import numpy as np
import pandas as pd
from pathprof.agent.probing import hooks
from pathprof.agent.probing.bpf.layout import HIST_WORDS, MAX_NETNS, MAX_PORTS
from pathprof.errors import UserError

ROLE_CLIENT = 1            # probes/conn.h enum pc_role
# probes/conn.h enum pc_step -> (name, kind, per): per "conn" = one sample per connection (mean = sum/count),
# "total" = an aggregate the analysis divides by the number of connections
STEPS = {
    1: ("connect.tcp_handshake", "latency", "conn"),
    2: ("connect.accept", "latency", "conn"),
    3: ("connect.fork", "latency", "conn"),
    4: ("connect.first_run", "latency", "conn"),
    5: ("connect.backend_init_auth", "latency", "conn"),
    6: ("connect.ready_delivery", "latency", "conn"),
    7: ("connect.first_query", "latency", "conn"),
    8: ("connect.teardown", "latency", "conn"),
    9: ("connect.reap", "latency", "conn"),
    10: ("connect.total", "latency", "conn"),
    11: ("connect.thread_wait", "latency", "total"),
    12: ("connect.client_total", "latency", "conn"),
    # a handshake retransmission's wait: only connections that had one, so per connection sampled
    13: ("connect.syn_retx", "latency", "total"),
    14: ("connect.synack_retx", "latency", "total"),
    15: ("connect.hop_accept", "latency", "conn"),
    16: ("cpu.client_connect", "cpu", "conn"),
    17: ("cpu.backend_init", "cpu", "conn"),
    18: ("cpu.backend_first_query", "cpu", "conn"),
    19: ("cpu.backend_exit", "cpu", "conn"),
    20: ("cpu.backend_total", "cpu", "conn"),
    21: ("cpu.postmaster", "cpu", "total"),
}
NSTEPS = 24
# probes/conn.h enum pc_stat
# "unmatched" is not a loss by itself: a backend whose client is not pgbench (the agent's own psycopg
# connections) has none; coverage (matched / pgbench's connections) is what says whether starts were lost
STATS = {0: "starts", 1: "accepts", 2: "forks", 3: "ready", 4: "matched", 5: "unmatched", 6: "tasks_full",
         7: "pending_full", 8: "out_of_order", 9: "gone_unready", 10: "reaped", 11: "accept_lost", 12: "no_peer",
         13: "negotiation", 14: "sampled", 15: "syn_retransmits", 16: "synack_retransmits", 17: "unpaired_sampled",
         18: "stale_starts", 19: "syn_retransmits_sampled", 20: "handshake_retx_sampled",
         21: "synack_retx_sampled", 22: "paired_by_isn", 23: "clients_sampled"}
# probes/conn_win.bpf.h: the windows the setup steps are charged against (the last WIN_RING of them)
WIN_RING = 16
WIN_OPEN = (1 << 64) - 1
# a stat row saying the setup steps' sums are their parts inside the windows, over every connection of the run
# (pathprof.analysis.conn_view divides them by the transactions inside the windows); absent from older runs
WINDOW_CHARGED = "window_charged"
# the server namespace's own counters (/proc/PID/net/netstat, TcpExt), read at reset() and stop(): connections
# the kernel refused or dropped because the postmaster's listen/accept queue was full
NETSTAT = {"ListenOverflows": "listen_overflows", "ListenDrops": "listen_drops"}
LOSS = ("tasks_full", "pending_full", "out_of_order", "accept_lost", "no_peer")
COLUMNS = [("step", str), ("kind", str), ("per", str), ("count", "int64"), ("sum_ns", "int64"),
           ("hist", object)]


def _probes_dir() -> Path:
    try:
        import pathprof.probes as pp
        return Path(pp.__file__).resolve().parent
    except Exception:  # pragma: no cover
        return Path(__file__).resolve().parents[2] / "probes"


def libc_of(pid: int) -> str:
    """Path (as this process can open it) of the libc that `pid` maps; ours when it has not mapped one yet
    (a process caught right after exec, before the dynamic loader ran)."""
    def mapped(p):
        try:
            for line in open(f"/proc/{p}/maps"):
                path = line.split(None, 5)[-1].strip() if line.count(" ") >= 5 else ""
                if os.path.basename(path).startswith("libc.so") or os.path.basename(path).startswith("libc-"):
                    return path
        except OSError:
            pass
        return None
    path = mapped(pid)
    if path:
        try:   # another mount namespace (a container): open it through the process's root
            if os.stat(f"/proc/{pid}/ns/mnt").st_ino != os.stat("/proc/self/ns/mnt").st_ino:
                return f"/proc/{pid}/root{path}"
        except OSError:
            pass
        return path
    own = mapped("self")
    if not own:
        raise UserError(f"cannot find the C library of process {pid}")
    return own


class ConnProbe:
    def __init__(self, postmaster_pid: int, service_ports: list[int], client_pids_hint=None,
                 clients_per_thread: int = 0, hop_ports: list[int] | None = None, netns: list[int] | None = None):
        self.pm_pid = int(postmaster_pid)
        # the path's namespaces (inode numbers): retransmissions and hop accepts are counted there only
        self.netns = [int(x) for x in netns or [] if x][:MAX_NETNS]
        # the ports hops listen on: their accept queues are timed (connect.hop_accept)
        self.hop_ports = sorted({int(p) for p in hop_ports or [] if p})[:MAX_PORTS]
        self.clients_per_thread = max(int(clients_per_thread or 0), 0)
        self.ports = sorted({int(p) for p in service_ports if p})
        if len(self.ports) > MAX_PORTS:
            raise UserError(f"the connection probe follows at most {MAX_PORTS} service ports, this path has "
                            f"{len(self.ports)}")
        self.hint = list(client_pids_hint or [])
        self.obj = None
        self._stats_fd = None
        self._base: dict = {}
        self._cost = {"run_time_ns": 0, "run_cnt": 0}
        self._clients: set[int] = set()
        self._windows: list[list[int]] = []      # [start, end] CLOCK_MONOTONIC ns, end WIN_OPEN while open
        self.notes: list[str] = []
        self.hook_choices: list = []

    # ---------------- lifecycle ----------------
    def start(self) -> None:
        if self.obj is not None:
            return
        from pathprof.agent.probing.bpf.libbpf import BpfObject, enable_stats
        try:
            self.obj = BpfObject(str(_probes_dir() / hooks.conn_object_for(hooks.kernel_facts())))
            self.obj.set_rodata(pm_pid=C.c_uint32(self.pm_pid), svc_ports=(C.c_uint16 * MAX_PORTS)(*self.ports),
                                max_closed=C.c_uint32(self.clients_per_thread),
                                hop_ports=(C.c_uint16 * MAX_PORTS)(*self.hop_ports),
                                path_netns=(C.c_uint32 * MAX_NETNS)(*self.netns))
            self.hook_choices = hooks.select_hooks(self.obj)   # tracepoint, else fentry/fexit (hooks.py)
            unused = hooks.unused_programs(self.hook_choices)
            for label, ok, detail in hooks.describe_choices(self.hook_choices):
                if not ok:
                    self.notes.append(f"connection probe, {label}: {detail}")
            self.obj.load()
            for name, prog in self.obj.programs.items():
                if hooks.kind_of(prog.section) and name not in unused:
                    self.obj.attach(name)
            libc = libc_of(self.pm_pid)
            self.obj.attach_uprobe("pc_accept_ret", self.pm_pid, libc, "accept", retprobe=True)
            self.obj.attach_uprobe("pc_reap", self.pm_pid, libc, "waitpid", retprobe=True)
            self._stats_fd = enable_stats()
            for pid in self.hint:
                self.track_client(pid)
        except BaseException:
            self.close()
            raise
        self.reset()

    def track_client(self, pid: int) -> None:
        """Follow `pid` (its threads now, new threads from the kernel) as a client opening connections."""
        if self.obj is None:
            return
        pid = int(pid)
        who = self.obj.maps["who"]
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            tids = [pid]
        for tid in tids:
            t = bytearray(C.sizeof(_Task))
            t[_Task.role.offset] = ROLE_CLIENT
            t[_Task.bucket.offset] = 1        # PC_B_IDLE
            try:
                who.update(bytes(C.c_uint32(tid)), bytes(t), 1)   # BPF_NOEXIST: keep a thread already followed
            except OSError:
                pass
        if pid not in self._clients:        # unix sockets: connect() has no TCP state change to catch
            self._clients.add(pid)
            try:
                self.obj.attach_uprobe("pc_connect", pid, libc_of(pid), "connect")
            except UserError as e:
                self.notes.append(f"connect() of client {pid} not probed (unix connection starts lost): {e}")

    def set_window(self, start_ns: int) -> None:
        """ProbeSession's window opened (its start, CLOCK_MONOTONIC ns) or closed (0). The setup steps are charged
        with their overlap with the windows (probes/conn_win.bpf.h); the CPU and off-path figures are of the
        connections that start inside a window. Opening an open window keeps its earlier start (always on: the
        window opened at pgbench's start, pathprof.agent.run.owned)."""
        if self.obj is None:
            return
        open_now = bool(self._windows) and self._windows[-1][1] == WIN_OPEN
        if start_ns and not open_now:
            self._windows.append([int(start_ns), WIN_OPEN])
        elif not start_ns and open_now:
            self._windows[-1][1] = time.monotonic_ns()
        if start_ns and open_now:
            start_ns = self._windows[-1][0]
        self.obj.maps["win"].update(bytes(C.c_uint32(0)), bytes(C.c_uint64(start_ns)))
        last = self._windows[-WIN_RING:] + [[0, 0]] * (WIN_RING - len(self._windows[-WIN_RING:]))
        ring = (C.c_uint64 * (2 * WIN_RING))(*[w[0] for w in last], *[w[1] for w in last])
        self.obj.maps["win_ring"].update(bytes(C.c_uint32(0)), bytes(ring))

    def reset(self) -> None:
        """The measured interval starts now: aggregates are monotonic, remember them."""
        if self.obj is not None:
            self._base = self._collect()

    def stop(self) -> pd.DataFrame:
        if self.obj is None:
            return empty_frame()
        try:
            now = self._collect()
        finally:
            self.close()
        base = self._base
        progs = {n: {k: v - base.get("progs", {}).get(n, {}).get(k, 0) for k, v in d.items()}
                 for n, d in now["progs"].items()}
        self._cost = {"run_time_ns": sum(p["run_time_ns"] for p in progs.values()),
                      "run_cnt": sum(p["run_cnt"] for p in progs.values()), "programs": progs}
        rows = []
        for idx, (name, kind, per) in STEPS.items():
            s, c, h = now["agg"][idx]
            if idx in base.get("agg", {}):
                b = base["agg"][idx]
                s, c, h = s - b[0], c - b[1], h - b[2]
            if c > 0:
                rows.append({"step": name, "kind": kind, "per": per, "count": int(c), "sum_ns": int(s),
                             "hist": None if per == "total" else [int(x) for x in h]})
        misses = sum(p.get("recursion_misses", 0) for p in progs.values())
        stats = {k: v - base.get("stats", {}).get(k, 0) for k, v in now["stats"].items()}
        stats["recursion_misses"] = misses
        stats[WINDOW_CHARGED] = 1
        for name, v in stats.items():
            rows.append({"step": name, "kind": "stat", "per": "", "count": int(v), "sum_ns": 0, "hist": None})
        lost = {k: stats[k] for k in LOSS if stats.get(k)}
        if lost:
            self.notes.append("connection probe: unmatched/lost events: " +
                              ", ".join(f"{k}={v}" for k, v in lost.items()))
        return pd.DataFrame(rows, columns=[c for c, _ in COLUMNS])

    def cost(self) -> dict:
        """bpf_stats of this object's programs over the measured interval (valid after stop())."""
        return dict(self._cost)

    def close(self) -> None:
        if self.obj is not None:
            self.obj.close()
            self.obj = None
        if self._stats_fd is not None:
            os.close(self._stats_fd)
            self._stats_fd = None

    # ---------------- readers ----------------
    def _collect(self) -> dict:
        agg = {}
        m = self.obj.maps["conn_agg"]
        for idx in STEPS:
            raw = m.lookup(bytes(C.c_uint32(idx)))
            a = np.frombuffer(raw, np.uint64).reshape(-1, HIST_WORDS).sum(axis=0).astype(np.int64) if raw \
                else np.zeros(HIST_WORDS, np.int64)
            agg[idx] = (int(a[0]), int(a[1]), a[2:])
        st = self.obj.maps["conn_stats"]
        stats = {}
        for idx, name in STATS.items():
            raw = st.lookup(bytes(C.c_uint32(idx)))
            stats[name] = int(np.frombuffer(raw, np.uint64).sum()) if raw else 0
        stats.update(listen_counters(self.pm_pid))
        progs = {}
        for name, p in self.obj.programs.items():
            if p.fd >= 0:
                i = p.info()
                progs[name] = {"run_time_ns": i.run_time_ns, "run_cnt": i.run_cnt,
                               "recursion_misses": i.recursion_misses}
        return {"agg": agg, "stats": stats, "progs": progs}


class _Task(C.Structure):
    """struct pc_task of probes/conn.h (only written whole, zeroed, by track_client)."""
    _fields_ = [("on_ts", C.c_uint64), ("cpu", C.c_uint64 * 8), ("start_ts", C.c_uint64), ("ready_ts", C.c_uint64),
                ("recv_ts", C.c_uint64), ("accept_ts", C.c_uint64), ("fork_ts", C.c_uint64),
                ("first_run_ts", C.c_uint64), ("qrecv_ts", C.c_uint64), ("gone_ts", C.c_uint64),
                ("dr_ts", C.c_uint64), ("dr_sk", C.c_uint64), ("fin", C.c_uint32), ("role", C.c_uint8),
                ("bucket", C.c_uint8), ("matched", C.c_uint8), ("unix_pending", C.c_uint8), ("ports", C.c_uint32),
                ("sampled", C.c_uint8), ("hello", C.c_uint8), ("fork_win", C.c_uint8), ("closed_once", C.c_uint8),
                ("close_ts", C.c_uint64), ("closed_n", C.c_uint32), ("starts_n", C.c_uint32),
                ("pend_key", C.c_uint64), ("first_ts", C.c_uint64)]


def listen_counters(pid: int) -> dict:
    """TcpExt ListenOverflows/ListenDrops of the namespace `pid` lives in (zeros when unreadable)."""
    from pathprof.agent.host.machine import net_counters
    out = dict.fromkeys(NETSTAT.values(), 0)
    try:
        text = open(f"/proc/{pid}/net/netstat").read()
    except OSError:
        return out
    out.update({NETSTAT[k]: v for k, v in net_counters(text, {"TcpExt": tuple(NETSTAT)}).items()})
    return out


def empty_frame() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in COLUMNS})
