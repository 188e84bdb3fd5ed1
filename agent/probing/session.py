"""The probes front end: load pathprof's BPF objects, follow the run's processes, attach the detailed
programs only inside measurement windows, read the in-kernel aggregates into DataFrames (see
pathprof.analysis.stages for what they mean, pathprof.agent.probing.frames for the readers).

    session = ProbeSession(ProbeConfig(level="basic", netns=[None], service_ports=[5432], postgres_bin=...))
    session.start(); session.track(pid, "pgbench"); session.reset(); session.start_windows(duration_s)
    ...; result = session.stop()        # result.windows: when each window was open, and the CPUs' busy time

Windows: the detailed programs are attached for `window_s` every `period_s` and fully detached in between;
the run measures its own perturbation (TPS inside vs outside the windows, pathprof.analysis.windows).
sched_process_fork stays attached all the time: it is rare and keeps the set of followed threads right (new
backends) between windows. Inside a window, the kernel's per-program statistics (bpf_stats, which add a clock
read to every run of every BPF program) are on only for a calibration slice at its start; the probes' cost
over the whole window is scaled from the slice by the messages the probes counted (pathprof.agent.probing.cost).

Tracked threads are the ones with task-local storage: user space creates it through a thread pidfd. With
pathprof-510.bpf.o (kernels without task storage) it is a hash keyed by thread id, written by id; its pp_exit and
pp_sk_free, which remove a thread's and a socket's entries, stay attached all the time as fork does.
"""
from __future__ import annotations

import ctypes as C
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from pathprof.agent.host.machine import cpu_times
from pathprof.agent.probing import frames as F
from pathprof.agent.probing import hooks as probe_hooks
from pathprof.agent.probing import own_conns
from pathprof.agent.probing.postgres_probes import PostgresProbes
from pathprof.agent.probing.windows import DEFAULT_PERIOD_S, DEFAULT_WINDOW_S
from pathprof.errors import UserError

PROBES_DIR = Path(__file__).resolve().parents[2] / "probes"
TRACEFS = "/sys/kernel/tracing"
LEVELS = ("off", "basic", "deep")
# attached for the whole session; everything else only in windows. pp_exit, pp_sk_free: pathprof-510.bpf.o only
ALWAYS_ON = ("pp_fork", "pp_exit", "pp_sk_free")
NETFILTER = ("nf_begin", "nf_end")      # BPF netfilter links, attached per (namespace, hook) with functions
PIDFD_THREAD = os.O_EXCL                # pidfd_open flag: a pidfd for one thread (Linux >= 6.9)
ADOPT = "pp_adopt"                      # the task iterator that tracks threads where PIDFD_THREAD is missing
# attached (in windows) only when the run tracks a process of one of these roles: zero cost on other paths
HOP_ROLES = {"pooler", "proxy", "qemu", "other"}
ONLY_FOR = {"pp_tcp_consume": HOP_ROLES, "pp_tap_read": {"qemu"}, "pp_tap_recv": {"qemu"}}
# a send's end (sock_send_length): a client's or server's TCP send is closed at its start (pp_tcp_send), so it is
# attached only for a hop's sends, AF_UNIX messages and --connect
SEND_END = "pp_sock_send"
SYN_SENT = "pp_syn_sent"      # --connect only: pgbench's thread busy connecting from its SYN (msg.bpf.h)
# link impairments (topologies.impairments): loaded only when the path has an impaired link; the delay line's
# brackets sit just before and after the mangle table (-150) of the hooks that hold packets
DEVICE_PROGS = ("pp_dev_xmit", "pp_dev_recv")   # dev.<device>: net_dev_start_xmit -> netif_receive_skb
QDISC_PROGS = ("pp_qdisc_enq", "pp_qdisc_deq", "pp_qdisc_recv", "pp_hold_begin", "pp_hold_end")
HOLD_PRI = {"pp_hold_begin": -151, "pp_hold_end": -149}


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
    window_s: float = DEFAULT_WINDOW_S    # detailed probes attached this long...
    period_s: float = DEFAULT_PERIOD_S    # ...every period_s; window_s <= 0 or period_s <= window_s: always on
    hop_slots: int = 8                    # distinct hops + 1 the run may track (sizes the latency array)
    tap_hop: bool = True                  # a qemu guest behind a tap is on the path (its wire needs send starts)
    netns_labels: dict = field(default_factory=dict)   # namespace reference -> name in the tables (discovered paths)
    devices: bool = True                  # a device other than lo is on the path (veth, bridge, tap): dev.<dev>
    lo_device: bool = False               # time lo as dev.lo too (else its time stays inside wire.<receiver>)
    qdisc: bool = False                   # an impaired link (topologies.impairments): qdisc.<dev> / delay.<dev>
    holds: list = field(default_factory=list)   # (netns, hook) of the delay lines: bracketed by pp_hold_*
    conn_split: bool = False              # --connect: setup exchanges are left to the connection probe (conn.py)
    hops: bool = True                     # a hop (pooler, proxy) may be between the clients and the backends
    unix: bool = True                     # AF_UNIX messages may be on the path (their sends are closed at the end)
    client: str = "pgbench"               # the client's name in the trace table's stage names (analysis.client)


@dataclass
class ProbeResult:
    stages: pd.DataFrame
    cpu: pd.DataFrame
    cost: dict
    lost: dict
    traces: pd.DataFrame | None = None
    counters: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    windows: list = field(default_factory=list)   # one dict per window (pathprof.agent.probing.windows)
    messages: pd.DataFrame | None = None          # --trace-sample: TCP message markers (frames.message_frame)
    hooks: dict | None = None                     # the way each event was measured (hooks.hooks_record)


def windows_asleep_ns(windows: list[dict]) -> float | None:
    """The CPUs' no-HZ sleep over the closed windows, None unless every one was read that way (a window with
    the tick-sampled busy time has no sleep to take from the idle tasks' time: no `idle` row then)."""
    if not windows or any(w.get("busy_source") != "nohz" for w in windows):
        return None
    return float(sum(w["asleep_ns"] for w in windows))


_pidfd_thread: list[bool] = []


def pidfd_thread_ok() -> bool:
    """Does pidfd_open take PIDFD_THREAD here (Linux >= 6.9)? Asked once, of this thread itself."""
    if not _pidfd_thread:
        try:
            os.close(os.pidfd_open(threading.get_native_id(), PIDFD_THREAD))
            _pidfd_thread.append(True)
        except OSError:
            _pidfd_thread.append(False)
    return _pidfd_thread[0]


def ensure_tracefs() -> bool:
    """Mount tracefs at /sys/kernel/tracing when it is not. Best effort: tp_btf, USDT and netfilter links do
    not need it (bpftrace scripts and classic tracepoints do); True when it is mounted."""
    if os.path.exists(f"{TRACEFS}/events"):
        return True
    os.system(f"mount -t tracefs tracefs {TRACEFS} >/dev/null 2>&1")
    return os.path.exists(f"{TRACEFS}/events")


def _threads_and_children(pid: int, skip=frozenset()) -> list[int]:
    """pid's threads, then (recursively) its child processes' threads; the processes in `skip` left out."""
    out, todo, seen = [], [pid], set(skip)
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
        self.main = None
        self.hops: dict[str, int] = {}
        self.roles: set[str] = set()     # roles tracked so far (ONLY_FOR)
        self.netns_names: dict[int, str] = {}
        self.nf_hooks: dict[str, list[str]] = {}   # namespace -> hooks bracketed (only those with functions)
        self.notes: list[str] = []
        self.dropped: set[str] = set()   # programs not loaded (their tracepoint is missing, another way chosen)
        self.hook_choices: list = []     # hooks.Choice per event: the way it is measured on this kernel
        self.object_name = probe_hooks.MAIN_OBJECT
        self._base: dict = {}
        self._lock = threading.RLock()
        self._detail: list = []          # links of the open window
        self._window: dict | None = None
        self._prepared: dict | None = None     # when prepare_window attached the next window's programs
        self.windows: list[dict] = []
        # called with each window's start (CLOCK_MONOTONIC ns) when it opens and 0 when it closes: other BPF
        # objects that must describe the same stretch of the run (the --connect probe, agent/probing/conn.py)
        self.window_listeners: list = []
        self.calibration = CostCalibration()
        self._runner = None
        self._ring = None
        self._spans: list[bytes] = []
        self.started = False
        self._server = None              # ServerChildren: follow_server
        self._postgres = PostgresProbes(self._note)   # deep: the postgres binary's USDT and uprobes

    # ---------------- lifecycle ----------------
    def start(self) -> None:
        """Load the object (verifier errors surface here, before the run) and attach fork only."""
        if self.config.level == "off" or self.started:
            return
        from pathprof.agent.probing.bpf import layout as L
        from pathprof.agent.probing.bpf.libbpf import BpfObject, num_possible_cpus
        from pathprof.agent.probing.bpf.ringbuf import ring_reader
        ensure_tracefs()
        ports = sorted({int(p) for p in self.config.service_ports if p})
        if len(ports) > L.MAX_PORTS:
            raise UserError(f"the probes follow at most {L.MAX_PORTS} service ports; this path has {len(ports)}")
        hop_slots = max(1, min(int(self.config.hop_slots), L.MAX_HOPS))
        deep = self.config.level == "deep"
        try:
            inos = self._netns_inodes()
            facts = probe_hooks.kernel_facts()
            self.object_name = probe_hooks.object_for(facts)   # kfunc, compat or 510 variant
            if self.object_name == probe_hooks.OLD_OBJECT:
                self._note("probe object " + probe_hooks.describe_object(facts))
            self.main = BpfObject(str(_probes_dir() / self.object_name))
            self.main.set_rodata(svc_ports=(C.c_uint16 * L.MAX_PORTS)(*ports), nf_netns=inos,
                                 nf_nns=C.c_uint32(len(self.netns_names)), lat_hops=C.c_uint32(hop_slots),
                                 trace_every=C.c_uint32(max(int(self.config.trace_sample or 0), 0)),
                                 tap_wire=C.c_uint32(1 if self.config.tap_hop else 0),
                                 time_lo=C.c_uint32(1 if self.config.lo_device else 0),
                                 qdisc_on=C.c_uint32(1 if self.config.qdisc else 0),
                                 conn_split=C.c_uint32(1 if self.config.conn_split else 0),
                                 send_at_start=C.c_uint32(0 if self.config.conn_split else 1),
                                 clients_connect_first=C.c_uint32(0 if self.config.hops else 1),
                                 unix_peer_ok=C.c_uint32(1 if facts.has_helper("skc_to_unix_sock") else 0))
            self.main.maps["lat"].set_max_entries(L.lat_entries(hop_slots))
            self.main.maps["nfagg"].set_max_entries((len(self.netns_names) + 1) * L.NF_PER_NETNS)
            self.main.maps["cpu_idle"].set_max_entries(num_possible_cpus())
            self.main.maps["traces"].set_max_entries(L.trace_ring_bytes(self.config.trace_sample))
            self.hop_slots = hop_slots
            self._select_programs(deep)
            self.main.load()
            for name in ALWAYS_ON:
                if name in self.main.programs and name not in self.dropped:
                    self.main.attach(name)
            self._find_nf_hooks()
            if self.config.trace_sample:
                self._ring = ring_reader(self.main.maps["traces"], C.sizeof(L.Trace), self._spans.append)
        except BaseException:
            self.close()
            raise
        self.started = True
        self.reset()

    def _select_programs(self, deep: bool) -> None:
        """Which programs load: deep's USDT only at --probes deep, qdisc and device programs only where the path
        has them, a tp_btf program only where its tracepoint exists (only its stage goes missing)."""
        from pathprof.agent.probing.bpf.libbpf import BPF_NETFILTER, BPF_PROG_TYPE_NETFILTER, kernel_has_tracepoint
        if deep:
            self._postgres.prepare(self.main)
        # the way of each event on this kernel (tracepoint, else fentry/fexit...): the other ways' programs stay out
        left_out = {n for n in self.main.programs if (n.startswith("pg_") and not deep) or
                    (n in QDISC_PROGS and not self.config.qdisc)}
        self.hook_choices = probe_hooks.select_hooks(self.main, skip=left_out)
        alternatives = probe_hooks.unused_programs(self.hook_choices)
        self.dropped |= alternatives
        for label, ok, detail in probe_hooks.describe_choices(self.hook_choices):
            if not ok or detail.startswith(("fentry", "fexit", "kprobe")):
                self._note(f"{label}: {detail}")
        for d in probe_hooks.degraded(probe_hooks.kernel_facts()):
            self._note(f"{d['feature']}: this kernel lacks {d['needs']}: {d['effect']}")
        for name, prog in self.main.programs.items():
            if name in alternatives:
                continue
            prog.set_autoload(deep or not name.startswith("pg_"))
            if name == ADOPT:           # needed only where user space cannot name a thread by pidfd (nor by id: 510)
                prog.set_autoload(not pidfd_thread_ok() and self.object_name != probe_hooks.OLD_OBJECT)
                self.dropped.add(name)  # never attached with the window's programs
                continue
            if name in QDISC_PROGS and not self.config.qdisc:
                prog.set_autoload(False)    # no netem on this path: never loaded, never attached
                self.dropped.add(name)
                continue
            if name in DEVICE_PROGS and not (self.config.devices or self.config.lo_device):
                prog.set_autoload(False)    # only lo on this path, folded into the wire: two runs per packet saved
                self.dropped.add(name)
                continue
            tp = prog.section.removeprefix("tp_btf/") if prog.section.startswith("tp_btf/") else None
            if tp and not kernel_has_tracepoint(tp):      # drop only the stage that needs it
                prog.set_autoload(False)
                self.dropped.add(name)
                self._note(f"tracepoint {tp} is not in this kernel: {name} not loaded, its stage is missing")
            if name in NETFILTER or name in HOLD_PRI:
                prog.set_type(BPF_PROG_TYPE_NETFILTER, BPF_NETFILTER)

    def _find_nf_hooks(self) -> None:
        from pathprof.agent.probing.nf_hooks import active_hooks
        for ns in self.netns_names.values():
            hooks, how = active_hooks(None if ns == "root" else ns)
            self.nf_hooks[ns] = hooks
            if "unreadable" in how:
                self._note(f"netfilter in {ns}: {how}")

    def _attach_detail(self) -> list:
        from pathprof.agent.probing.bpf.libbpf import NF_PRI_FIRST, NF_PRI_LAST
        out = []
        for name, prog in self.main.programs.items():
            base = probe_hooks.split_name(name)[0]    # a fallback program is attached as its event's first way would be
            if (base in ONLY_FOR and not ONLY_FOR[base] & self.roles) or name in self.dropped:
                continue
            if base == SEND_END and not (self.config.unix or self.config.conn_split or HOP_ROLES & self.roles):
                continue
            if base == SYN_SENT and not self.config.conn_split:
                continue
            if name not in ALWAYS_ON and name not in NETFILTER and name not in HOLD_PRI and not name.startswith("pg_"):
                out.append(self.main.attach(name))
        if self.config.level == "deep":
            out += self._postgres.attach(self.main, self.config.postgres_bin)
        for ns, hooks in self.nf_hooks.items() if "nf_begin" not in self.dropped else ():
            try:
                for hook in hooks:
                    out.append(self.main.attach_netfilter("nf_begin", hook, NF_PRI_FIRST, None if ns == "root" else ns))
                    out.append(self.main.attach_netfilter("nf_end", hook, NF_PRI_LAST, None if ns == "root" else ns))
            except (UserError, OSError) as e:     # BpfError, NetfilterLinkError
                self._note(f"netfilter brackets not attached in {ns} namespace: {e}")
        for ns, hook in self.config.holds if self.config.qdisc and "pp_hold_begin" not in self.dropped else []:
            try:
                for name, pri in HOLD_PRI.items():
                    out.append(self.main.attach_netfilter(name, hook, pri, ns))
            except (UserError, OSError) as e:
                self._note(f"delay line brackets not attached in {ns or 'root'} {hook}: {e}; its hold is in the wire")
        return out

    def _note(self, text: str) -> None:
        if text not in self.notes:        # the same failure in every window is one note
            self.notes.append(text)

    def _set_window(self, start_ns: int) -> None:
        self.main.maps["win"].update(bytes(C.c_uint32(0)), bytes(C.c_uint64(start_ns)))
        for listener in self.window_listeners:
            listener(start_ns)

    # ---------------- measurement windows ----------------
    def open_window(self) -> None:
        """Attach the detailed programs, then open the window (its start is written last: a program that ran
        before sees 0 and does nothing, so no switch in the window is missed)."""
        with self._lock:
            if not self.started or self._window is not None:
                return
            # attached earlier by prepare_window: the window's edge (programs attached, no window) begins there
            w = self._prepared or {"attach_mono_ns": time.monotonic_ns(), "attach_realtime_ns": time.time_ns()}
            self._prepared = None
            self._attach_detail_once()
            self.refresh_server()            # before the window starts: its spans land in the right role
            w["cpu0"] = cpu_times()
            w["start_mono_ns"], w["start_realtime_ns"] = time.monotonic_ns(), time.time_ns()
            self._set_window(w["start_mono_ns"])
            self._window = w

    def prepare_window(self) -> None:
        """Attach the detailed programs now for a window that opens at a set moment (--start-at): attaching them
        takes 0.1-0.5 s on a loaded machine, which made the window start that late (three agents' windows 19 %
        apart). Until the window opens they see no window and return at once."""
        with self._lock:
            if self.started and self._window is None and not self._detail:
                began = {"attach_mono_ns": time.monotonic_ns(), "attach_realtime_ns": time.time_ns()}
                self._attach_detail_once()
                self._prepared = began

    def _attach_detail_once(self) -> None:
        """The window's programs, unless prepare_window attached them already; none left attached on failure."""
        if self._detail:
            return
        try:
            self._detail = self._attach_detail()
        except BaseException:
            self._detach()
            raise

    def begin_calibration(self) -> None:
        """bpf_stats on for a slice of the open window (pathprof.agent.probing.cost)."""
        with self._lock:
            if self._window is not None:
                self.calibration.begin(self.main)

    def end_calibration(self) -> bool | None:
        """The slice closed: False when the cost module dropped it (agent.probing.cost), None without a window."""
        with self._lock:
            if self._window is not None:
                return self.calibration.end(self.main)
        return None

    def close_window(self) -> None:
        with self._lock:
            w, self._window = self._window, None
            if w is None:
                return
            self.calibration.end(self.main)
            cpu1 = cpu_times()        # window still open: visiting each CPU ends its idle task's time in it too
            self._set_window(0)
            w["end_mono_ns"], w["end_realtime_ns"] = time.monotonic_ns(), time.time_ns()
            self._detach()
            w["detached_mono_ns"], w["detached_realtime_ns"] = time.monotonic_ns(), time.time_ns()
            cpu0 = w.pop("cpu0")
            w.update({k: cpu1[k] - cpu0[k] for k in ("busy_ns", "total_ns", "asleep_ns", "busy_tick_ns", "steal_ns")})
            w["busy_source"] = cpu1["busy_source"] if cpu0["busy_source"] == cpu1["busy_source"] else "tick"
            if w["busy_source"] == "tick":    # a mixed pair: both ends from /proc/stat
                w["busy_ns"] = w["busy_tick_ns"]
            w["elapsed_ns"] = w["end_mono_ns"] - w["start_mono_ns"]
            self.windows.append(w)
            self.poll_traces()

    def _detach(self) -> None:
        self.calibration.abort()
        if self.main is not None:
            self.main.detach(self._detail)
        self._detail, self._prepared = [], None

    def start_windows(self, duration_s: float | None, ready=None) -> None:
        """pgbench started: open windows on the configured schedule (or one window, always on), counted from when
        ready() first holds (its start-up over; None: from now)."""
        if not self.started:
            return
        from pathprof.agent.probing.windows import WindowRunner
        self._runner = WindowRunner(self, self.config.window_s, self.config.period_s, duration_s, ready)
        self._runner.start()

    def stop_windows(self) -> None:
        """No more windows: stop the schedule and close the open one (stop() does it too)."""
        if self._runner is not None:
            self._runner.stop()
            self._runner = None
        self.close_window()

    def follow_server(self, postmaster: int, kind_of) -> None:
        """Re-track the postmaster's children that are not client backends (pathprof.agent.probing.server)."""
        self._server = ServerChildren(self, postmaster, kind_of)

    def refresh_server(self) -> None:
        if self._server is not None and self.started:
            self._server.refresh()

    def poll(self) -> None:
        """Inside a window, every POLL_S: drain sampled spans; look at the server's new children."""
        self.poll_traces()
        if self._server is not None and self._server.due():
            self.refresh_server()

    def poll_traces(self) -> None:
        with self._lock:               # ring_buffer__consume is not safe from two threads at once
            if self._ring is not None:
                self._ring.consume()

    def track(self, pid: int, role: str, hop: str | None = None, aux: str | None = None,
              skip: frozenset = frozenset()) -> None:
        """Follow pid (its threads and children) as `role` (a hop's processes with its name, PostgreSQL's
        auxiliary processes with their kind, layout.AUX_KINDS); forks are then followed in the kernel. `skip`:
        processes (with their threads and children) left alone -- pathprof's own, a pooler child its counters
        connection holds."""
        if not self.started:
            return
        from pathprof.agent.probing.bpf import layout as L
        if role not in L.ROLES:
            raise UserError(f"unknown probe role {role!r} (one of {', '.join(L.ROLES)})")
        self.roles.add(role)
        hop_id = 0
        if aux:
            hop_id = L.AUX_KINDS.get(aux, L.AUX_KINDS["other"])
        elif hop:
            hop_id = self.hops.setdefault(hop, len(self.hops) + 1)
            if hop_id >= self.hop_slots:
                raise UserError(f"at most {self.hop_slots - 1} distinct hops can be profiled on this path "
                                f"(hop {hop!r})")
        tasks = self.main.maps["tasks"]
        if self.object_name == probe_hooks.OLD_OBJECT:    # a hash keyed by thread id: no pidfd needed
            self._track_by_tid(tasks, _threads_and_children(int(pid), skip), role, hop_id)
            return
        adopt = []                       # threads a pidfd cannot name on this kernel (pp_adopt gives them storage)
        for tid in _threads_and_children(int(pid), skip):
            try:
                fd = os.pidfd_open(tid, PIDFD_THREAD if pidfd_thread_ok() else 0)
            except OSError:
                if not pidfd_thread_ok() and os.path.exists(f"/proc/{tid}"):
                    adopt.append(tid)    # not a process's main thread: no pidfd for it before Linux 6.9
                continue                 # gone meanwhile (a thread that exits is not followed)
            try:
                key = bytes(C.c_int(fd))
                old = tasks.lookup(key)  # already followed (forked): keep what it has in flight
                t = L.Task.from_buffer_copy(old) if old else L.Task()
                t.role, t.hop = L.ROLES[role], hop_id
                tasks.update(key, bytes(t))
            except OSError as e:
                self._note(f"could not track {tid} ({role}): {e}")
            finally:
                os.close(fd)
        if adopt:
            self._adopt(adopt, role, hop_id)

    def _track_by_tid(self, tasks, tids, role: str, hop_id: int) -> None:
        """pathprof-510.bpf.o: `tasks` is a hash keyed by thread id (pp_state.bpf.h). A thread that exited meanwhile
        (its pp_exit ran before the entry was written) has its entry taken out again, or its id, reused, would be
        taken for it."""
        from pathprof.agent.probing.bpf import layout as L
        for tid in tids:
            key = bytes(C.c_uint32(tid))
            try:
                old = tasks.lookup(key)  # already followed (forked): keep what it has in flight
                t = L.Task.from_buffer_copy(old) if old else L.Task()
                t.role, t.hop = L.ROLES[role], hop_id
                tasks.update(key, bytes(t))
                if not os.path.exists(f"/proc/{tid}"):
                    tasks.delete(key)
            except OSError as e:
                self._note(f"could not track {tid} ({role}): {e}")

    def _adopt(self, tids: list[int], role: str, hop_id: int) -> None:
        """Storage for threads through the kernel (sched.bpf.h, pp_adopt): their tids into `adopt`, one pass of
        the task iterator."""
        from pathprof.agent.probing.bpf import layout as L
        t = L.Task()
        t.role, t.hop = L.ROLES[role], hop_id
        for tid in tids:
            self.main.maps["adopt"].update(bytes(C.c_uint32(tid)), bytes(t))
        try:
            self.main.run_iter(ADOPT)
        except OSError as e:             # BpfError
            self._note(f"could not track {len(tids)} threads ({role}): {e}")

    def own_connection(self, fd: int) -> None:
        """pathprof's own TCP connection `fd` into the path: nothing on it is measured (own_conns.py)."""
        if self.started:
            own_conns.register(self.main.maps["own_conns"], fd)

    def reset(self) -> None:
        """The measured interval starts now: every aggregate is a monotonic counter, so remember them."""
        if self.main is None:
            return
        self._base = F.collect(self.main)
        self.calibration.reset()

    def frames(self, asleep_ns: float | None = None):
        """(stages, cpu, stats) since reset(), for the live view: a public snapshot, read under the lock.
        asleep_ns: the CPUs' no-HZ sleep over the interval the probes counted (frames.cpu_frame)."""
        with self._lock:
            if self.main is None:
                return None
            now = F.collect(self.main)
            devs = F.devnames(self.netns_names)
        stages = F.stage_frame(now, self._base, devs, self.hops, self._ns_labels(), self.hop_slots)
        return (stages, F.cpu_frame(now, self._base, self.hops, asleep_ns),
                F.sub(now["stats"], self._base.get("stats", {})))

    def status(self, map_usage) -> dict | None:
        """For the status file (agent.run.status): the maps' usage and the event counters since reset()."""
        with self._lock:
            if self.main is None or not self.started:
                return None
            st = F.sub(F.read_stats(self.main), self._base.get("stats", {}))
            maps = map_usage(self.main)
        lost = {k: v for k, v in st.items() if k in F.LOSS and v}
        return {"maps": maps, "events": {"messages": st.get("messages", 0), "lost": lost,
                                         "lost_total": sum(lost.values())}}

    def snapshot(self) -> dict:
        if not self.started:
            return {}
        with self._lock:
            st = F.sub(F.read_stats(self.main), self._base.get("stats", {}))
        cost = self.calibration.estimate(st.get("messages", 0))
        return {"messages": st.get("messages", 0), "lost": sum(v for k, v in st.items() if k in F.LOSS),
                "probe_ns": cost["run_time_ns"], "window_open": self._window is not None}

    def stop(self) -> ProbeResult:
        if not self.started:
            self.close()
            return ProbeResult(F.empty_stages(), F.empty_cpu(), {"run_time_ns": 0, "run_cnt": 0, "programs": {}}, {},
                               notes=list(self.notes))
        try:
            self.stop_windows()
            now = F.collect(self.main)
            devs = F.devnames(self.netns_names)
            self.poll_traces()
        finally:
            self.close()
        base = self._base
        stats = F.sub(now["stats"], base.get("stats", {}))
        cost = self.calibration.estimate(stats.get("messages", 0),
                                         sum(int(w.get("elapsed_ns") or 0) for w in self.windows) or None)
        cost["netfilter_hooks"] = {ns: hooks for ns, hooks in self.nf_hooks.items()}
        lost = {k: v for k, v in stats.items() if k in F.LOSS and v}
        misses = sum(p.get("recursion_misses", 0) for p in F.sub_prog(now["progs"], base.get("progs", {})).values())
        if misses:
            lost["recursion_misses"] = misses
        notes = list(self.notes)
        if lost:
            notes.append("lost/unpaired events: " + ", ".join(f"{k}={v}" for k, v in lost.items()))
        if stats.get("window_edge"):
            notes.append(f"window edges: {stats['window_edge']} pairings begun before a window opened were discarded")
        stages = F.stage_frame(now, base, devs, self.hops, self._ns_labels(), self.hop_slots)
        asleep = windows_asleep_ns(self.windows)
        cpu = F.cpu_frame(now, base, self.hops, asleep)
        stats["idle_task_ns"], stats["idle_task_switches"] = (int(x) for x in F.idle_task(now, base))
        if asleep is not None:
            stats["asleep_ns"] = int(asleep)
        traces = F.trace_frame(self._spans, self.hops, self.config.client) if self.config.trace_sample else None
        messages = F.message_frame(self._spans, self.hops) if self.config.trace_sample else None
        return ProbeResult(stages, cpu, cost, lost, traces, counters=stats, notes=notes, windows=list(self.windows),
                           messages=messages, hooks=probe_hooks.hooks_record(
                               self.hook_choices, self.object_name,
                               self._postgres.multi if self.config.level == "deep" else None,
                               probe_hooks.kernel_facts()))

    def close(self) -> None:
        if self._runner is not None:
            self._runner.stop()
            self._runner = None
        with self._lock:
            self._window = None
            self._detach()
            if self._ring is not None:
                self._ring.free()
                self._ring = None
            if self.main is not None:
                self.main.close()
            self.main = None
            self.started = False

    def _ns_labels(self) -> dict:
        """netns inode -> the name the tables show (a discovered namespace's label instead of its /proc path)."""
        return {ino: self.config.netns_labels.get(ref, ref) for ino, ref in self.netns_names.items()}

    def _netns_inodes(self):
        """The topology's namespaces (None = ours) -> their inodes, in slot order (the last slot is "other")."""
        from pathprof.agent.host.netns import ns_path
        from pathprof.agent.probing.bpf import layout as L
        names = list(dict.fromkeys(self.config.netns or [None]))
        if len(names) > L.MAX_NETNS - 1:
            raise UserError(f"the probes follow at most {L.MAX_NETNS - 1} network namespaces; this path has "
                            f"{len(names)}")
        for ns in names:
            try:
                ino = os.stat(ns_path(ns) if ns else "/proc/self/ns/net").st_ino & 0xFFFFFFFF
            except OSError as e:
                raise UserError(f"network namespace {ns}: {e}") from None
            self.netns_names[ino] = ns or "root"
        return (C.c_uint32 * L.MAX_NETNS)(*self.netns_names)


from pathprof.agent.probing.cost import CostCalibration  # noqa: E402  (kept below: it imports nothing of ours)
from pathprof.agent.probing.server import ServerChildren  # noqa: E402
