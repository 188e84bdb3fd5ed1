"""Which way each probe event is measured on this kernel, chosen before the object is loaded.

The probes' object carries, for some events, more than one way to get the same event: a tracepoint through tp_btf
(what this project's 6.18 kernel offers), else fentry/fexit on the kernel function the tracepoint sits in (Linux
6.1 and older have the functions but not the tracepoints), else a kprobe. A program's name says which event it
serves: `pp_sock_recv` is the first way, `pp_sock_recv__fexit_inet` and `pp_sock_recv__fexit_unix` together are the
second (all programs of one event with the same attach kind form one way). Each way is looked up in what the kernel
offers (its BTF, the functions ftrace can attach to, kallsyms), as libbpf-tools' tracepoint_exists /
fentry_can_attach / kprobe_exists do; the first usable way is loaded, every other program of the event gets
autoload off. The stage an event feeds keeps its name and meaning whichever way it came. The netfilter brackets
are events too: BPF netfilter links (6.4), else fentry/fexit on nf_hook_slow.

The object carries no kprobe way yet: the events' code reads kernel structures through the BTF-typed pointers
tp_btf and fentry hand it, which a kprobe does not get, and every x86-64 kernel with BTF from 5.5 on has fentry.
The selection below knows kprobes (a kernel without fentry, e.g. arm64 before 6.0, is where they would be needed).

Also here: the object variant (pathprof.bpf.o reads kernel fields through the bpf_rdonly_cast kfunc, 6.2+;
pathprof-compat.bpf.o through bpf_probe_read_kernel; pathprof-510.bpf.o, for kernels without task and socket storage
in tracing programs or without BPF atomics that fetch, keeps both in hash maps), and the minimum kernel
(kernel_shortfalls).
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field

# attach kinds in the order they are tried; fentry and fexit are one kind (the same kernel mechanism); a BPF
# netfilter link is a first way as a tracepoint is
KIND_ORDER = {"tp_btf": 0, "netfilter": 0, "fentry": 1, "fexit": 1, "kprobe": 2, "kretprobe": 2}
KIND_LABEL = {"tp_btf": "tp_btf", "netfilter": "netfilter link", "fentry": "fentry/fexit", "fexit": "fentry/fexit",
              "kprobe": "kprobe", "kretprobe": "kprobe"}
# the events whose way is shown by `doctor` and recorded in run.json, with the stage(s) they end or start
EVENT_LABELS = {
    "sk_data_ready": "data ready (wire.* ends, wakeup starts)",
    "sock_recv": "receive end (recv.* ends)",
    "sock_send": "send end (proc.* of hops and AF_UNIX senders)",
    "tcp_send": "TCP send start (wire.* starts)",
    "data_ready": "--connect: data ready",
    "send": "--connect: send end",
    "recv": "--connect: receive end",
    "nf_begin": "netfilter hook entry (netfilter.* starts)",
    "nf_end": "netfilter hook exit (netfilter.* ends)",
    "qdisc_enq": "--link impairments: qdisc enqueue (qdisc.<dev>)",
    "hold_begin": "--link delays: delay line entry (delay.<dev>, else in the wire)",
    "hold_end": "--link delays: delay line exit (delay.<dev>, else in the wire)",
    "sk_free": "socket destroyed (pathprof-510.bpf.o: its entry leaves the socket hash)",
}
AVAILABLE_FILTER_FUNCTIONS = ("/sys/kernel/tracing/available_filter_functions",
                              "/sys/kernel/debug/tracing/available_filter_functions")
BTF_KIND_FUNC = 12


def split_name(prog: str) -> tuple[str, str]:
    """`pp_sock_recv__fexit_inet` -> ("pp_sock_recv", "fexit_inet"); a first way has no variant."""
    base, _, variant = prog.partition("__")
    return base, variant


def event_name(base: str) -> str:
    """The event a program family serves, without the object's prefix (pp_ / pc_)."""
    return base.split("_", 1)[1] if base[:3] in ("pp_", "pc_") else base


def kind_of(section: str) -> str | None:
    kind = section.split("/", 1)[0]
    return kind if kind in KIND_ORDER else None


@dataclass(frozen=True)
class Way:
    rank: int                           # KIND_ORDER of its programs
    programs: tuple[tuple[str, str], ...]   # (program name, section)

    @property
    def kind(self) -> str:
        return KIND_LABEL[kind_of(self.programs[0][1])]

    @property
    def targets(self) -> list[str]:
        return [sec.split("/", 1)[1] for _, sec in self.programs if "/" in sec]

    def describe(self) -> str:
        if self.kind == "netfilter link":
            return "netfilter link"
        kinds = sorted({sec.split("/", 1)[0] for _, sec in self.programs})
        return f"{'/'.join(kinds)} {'+'.join(self.targets)}"


@dataclass
class Choice:
    event: str                  # program family (its first way's program name)
    ways: list[Way]             # every way the object has for it, in the order tried
    chosen: Way | None = None
    refused: list[tuple[Way, str]] = field(default_factory=list)   # ways tried before the chosen one, and why not

    def to_json(self) -> dict:
        return {"event": event_name(self.event), "hook": self.chosen.describe() if self.chosen else None,
                "kind": self.chosen.kind if self.chosen else None,
                "refused": [{"hook": w.describe(), "why": why} for w, why in self.refused]}


LACKS_ENV = "PATHPROF_KERNEL_LACKS"


def pretended_lacks() -> frozenset[str]:
    """PATHPROF_KERNEL_LACKS=name,...: tracepoints, kfuncs (bpf_rdonly_cast), helpers (skc_to_unix_sock),
    `netfilter_links` or `fentry` this kernel is to be taken as lacking, so that the fallbacks an older kernel
    needs are tried here (the suite's tests of them; a user comparing hooks). run.json records them."""
    return frozenset(x.strip() for x in os.environ.get(LACKS_ENV, "").split(",") if x.strip())


class KernelFacts:
    """What this kernel offers to attach to, looked up once per process. Tests give a fake one (same methods)."""

    def __init__(self, release: str | None = None):
        import platform
        self.lacks = pretended_lacks()
        self.release = release or platform.release()

    @functools.lru_cache(maxsize=None)
    def has_tracepoint(self, name: str) -> bool:
        from pathprof.agent.probing.bpf.libbpf import kernel_has_tracepoint
        return name not in self.lacks and kernel_has_tracepoint(name)

    @functools.lru_cache(maxsize=None)
    def has_btf_func(self, name: str) -> bool:
        from pathprof.agent.probing.bpf.libbpf import kernel_btf_find
        return name not in self.lacks and kernel_btf_find(name, BTF_KIND_FUNC)

    @functools.lru_cache(maxsize=None)
    def has_helper(self, name: str) -> bool:
        """A BPF helper (bpf_func_id's BPF_FUNC_<name>) in this kernel's BTF."""
        from pathprof.agent.probing.bpf.libbpf import kernel_enum_values
        return name not in self.lacks and f"BPF_FUNC_{name}" in kernel_enum_values("bpf_func_id")

    @functools.lru_cache(maxsize=None)
    def has_map_type(self, name: str) -> bool:
        """A BPF map type (bpf_map_type's BPF_MAP_TYPE_<name>) in this kernel's BTF."""
        from pathprof.agent.probing.bpf.libbpf import kernel_enum_values
        return name not in self.lacks and f"BPF_MAP_TYPE_{name}" in kernel_enum_values("bpf_map_type")

    @functools.cached_property
    def fetch_atomics(self) -> bool:
        """BPF atomics that return the old value (BPF_FETCH: fetch-add, xchg, cmpxchg; Linux 5.12). Instructions
        are not in BTF: the release says (a kernel that reports none is taken to have them)."""
        rel = release_tuple(self.release)
        return "fetch_atomics" not in self.lacks and (rel == (0, 0) or rel >= (5, 12))

    @functools.cached_property
    def switch_prev_state(self) -> bool:
        """sched_switch hands tp_btf programs prev_state (its fourth argument: Linux 5.18)."""
        from pathprof.agent.probing.bpf.libbpf import kernel_tracepoint_args
        return "prev_state" not in self.lacks and (kernel_tracepoint_args("sched_switch") or 0) >= 4

    @functools.cached_property
    def _traceable(self) -> set[str] | None:
        for path in AVAILABLE_FILTER_FUNCTIONS:
            try:
                with open(path) as f:
                    return {line.split()[0] for line in f if line.strip()}
            except OSError:
                continue
        return None

    def traceable(self, name: str) -> bool | None:
        """Can ftrace attach at `name` (listed in available_filter_functions)? None: the list is unreadable."""
        t = self._traceable
        return None if t is None else name in t

    @functools.cached_property
    def _kallsyms(self) -> set[str]:
        try:
            with open("/proc/kallsyms") as f:
                return {parts[2] for parts in (line.split() for line in f) if len(parts) >= 3}
        except OSError:
            return set()

    def has_kprobes(self) -> bool:
        return os.path.isdir("/sys/bus/event_source/devices/kprobe")

    def has_symbol(self, name: str) -> bool:
        return name in self._kallsyms

    @functools.cached_property
    def netfilter_links(self) -> bool:
        """BPF netfilter programs and links (Linux 6.4): the program type in the kernel's BTF."""
        from pathprof.agent.probing.bpf.libbpf import kernel_enum_values
        return "netfilter_links" not in self.lacks and "BPF_PROG_TYPE_NETFILTER" in kernel_enum_values("bpf_prog_type")

    @functools.cached_property
    def fentry_error(self) -> str | None:
        """None when an fentry program loads and attaches here (tried once: some kernels have the functions in
        BTF and still refuse fentry), else why not."""
        if "fentry" in self.lacks:
            return f"taken as absent ({LACKS_ENV})"
        from pathprof.agent.probing.doctor import try_fentry
        return try_fentry()


def group_ways(programs: dict[str, str]) -> dict[str, list[Way]]:
    """Program name -> section, grouped into events; each event's ways in the order they are tried. Programs of a
    kind this module does not choose (usdt, uprobe, netfilter) are left out."""
    families: dict[str, dict[int, list]] = {}
    for name, sec in programs.items():
        kind = kind_of(sec)
        if kind is None:
            continue
        base, _ = split_name(name)
        families.setdefault(base, {}).setdefault(KIND_ORDER[kind], []).append((name, sec))
    return {base: [Way(rank, tuple(progs)) for rank, progs in sorted(ways.items())]
            for base, ways in families.items()}


def why_unusable(way: Way, facts) -> str | None:
    """None when every program of the way can attach on this kernel, else the first reason it cannot."""
    for _, sec in way.programs:
        kind, _, target = sec.partition("/")
        if kind == "netfilter":
            if not facts.netfilter_links:
                return "no BPF netfilter links in this kernel (Linux 6.4)"
        elif kind == "tp_btf":
            if not facts.has_tracepoint(target):
                return f"no tracepoint {target} in this kernel's BTF"
        elif kind in ("fentry", "fexit"):
            if not facts.has_btf_func(target):
                return f"no function {target} in this kernel's BTF"
            if facts.traceable(target) is False:
                return f"{target} is not in available_filter_functions (inlined or notrace)"
        elif kind in ("kprobe", "kretprobe"):
            if not facts.has_kprobes():
                return "no kprobes in this kernel (CONFIG_KPROBE_EVENTS)"
            if not facts.has_symbol(target) and facts.traceable(target) is not True:
                return f"no symbol {target} in /proc/kallsyms"
    if way.rank == KIND_ORDER["fentry"] and facts.fentry_error:
        return f"fentry/fexit refused here: {facts.fentry_error}"
    return None


def choose(programs: dict[str, str], facts) -> list[Choice]:
    """The first usable way of every event, and the ways refused before it (with their reasons)."""
    out = []
    for base, ways in group_ways(programs).items():
        choice = Choice(base, ways)
        for way in ways:
            why = why_unusable(way, facts)
            if why is None:
                choice.chosen = way
                break
            choice.refused.append((way, why))
        out.append(choice)
    return out


def unused_programs(choices: list[Choice]) -> set[str]:
    """Programs to load with autoload off: every way of an event but the chosen one (all of them when none is
    usable: only that event's stage goes missing)."""
    chosen = {name for c in choices if c.chosen for name, _ in c.chosen.programs}
    return {name for c in choices for w in c.ways for name, _ in w.programs} - chosen


def hooks_record(choices: list[Choice], obj: str, usdt_multi: bool | None = None,
                 facts: KernelFacts | None = None) -> dict:
    """run.json's probes.hooks: the object variant and, per event with a choice to make (more than one way, or
    none usable), the way chosen and the ways refused; with --probes deep, how PostgreSQL's USDT notes were
    attached (usdt_multi: one uprobe_multi link per program, else one uprobe per note); with `facts`, what the
    kernel's lacks cost the run (`degraded`) and what it was only taken to lack (`pretended`)."""
    events = [c.to_json() for c in choices if len(c.ways) > 1 or c.chosen is None]
    if usdt_multi is not None:
        events.append(usdt_record(usdt_multi))
    out = {"object": obj, "events": events}
    if facts is not None:
        out["degraded"] = degraded(facts)
        if facts.lacks:
            out["pretended"] = sorted(facts.lacks)
    return out


# Helpers a measurement needs and no other way replaces: without one, the probes load (the code that calls it is
# dead, set before load) and the measurement it serves is not made. helper -> (what, since, what the run lacks)
OPTIONAL_HELPERS = {
    "skc_to_unix_sock": ("unix stream peer", "bpf_skc_to_unix_sock, Linux 5.16",
                         "AF_UNIX sends carry no transaction number in sampled traces, and a unix sender blocked "
                         "at its send buffer is not a window stall"),
}


def degraded(facts) -> list[dict]:
    """What this kernel's missing optional helpers cost a run (empty on a kernel that has them all)."""
    return [{"feature": what, "needs": since, "effect": effect}
            for helper, (what, since, effect) in OPTIONAL_HELPERS.items() if not facts.has_helper(helper)]


def usdt_record(multi: bool) -> dict:
    return {"event": "postgres_usdt", "hook": "uprobe_multi" if multi else "uprobe per note",
            "kind": "uprobe", "refused": [] if multi else [
                {"hook": "uprobe_multi", "why": "no uprobe_multi links in this kernel (Linux 6.6)"}]}


_facts: list = []


def kernel_facts() -> KernelFacts:
    """This kernel's facts, shared by every object a process loads (the lookups are cached in it)."""
    if not _facts:
        _facts.append(KernelFacts())
    return _facts[0]


def select_hooks(obj, facts=None, skip: set[str] = frozenset()) -> list[Choice]:
    """Choose the way of every event of a BpfObject before its load: the others' programs get autoload off.
    `skip`: programs the caller leaves out anyway (their ways are then not looked at)."""
    facts = facts or kernel_facts()
    choices = choose({n: p.section for n, p in obj.programs.items() if n not in skip}, facts)
    for name in unused_programs(choices):
        obj.programs[name].set_autoload(False)
    return choices


def describe_choices(choices: list[Choice]) -> list[tuple[str, bool, str]]:
    """(event label, chosen?, detail) per event with a choice to make, for `doctor` and the run's notes."""
    out = []
    for c in choices:
        if len(c.ways) < 2 and c.chosen is not None:
            continue
        label = EVENT_LABELS.get(event_name(c.event), event_name(c.event))
        refused = "; ".join(f"not {w.describe()}: {why}" for w, why in c.refused)
        if c.chosen:
            out.append((label, True, c.chosen.describe() + (f" ({refused})" if refused else "")))
        else:
            out.append((label, False, f"no way on this kernel ({refused}): the stage it feeds is missing"))
    return out


# ---------------- the object variant and the minimum kernel ----------------
MAIN_OBJECT, COMPAT_OBJECT, OLD_OBJECT = "pathprof.bpf.o", "pathprof-compat.bpf.o", "pathprof-510.bpf.o"
CONN_OBJECT, CONN_OLD_OBJECT = "conn.bpf.o", "conn-510.bpf.o"


def old_kernel_lacks(facts) -> list[str]:
    """What this kernel lacks that pathprof.bpf.o and pathprof-compat.bpf.o need and pathprof-510.bpf.o does without
    (empty: one of those two runs here). Each from the kernel's BTF where it is there (backports carry it too)."""
    out = []
    if not facts.has_map_type("TASK_STORAGE") or not facts.has_helper("task_storage_get"):
        out.append("task-local storage (BPF_MAP_TYPE_TASK_STORAGE, bpf_task_storage_get: Linux 5.11)")
    if not facts.has_btf_func("bpf_sk_storage_get_tracing"):
        out.append("bpf_sk_storage_get in tracing programs (Linux 5.11)")
    if not facts.has_helper("get_current_task_btf"):
        out.append("bpf_get_current_task_btf (Linux 5.11)")
    if not facts.fetch_atomics:
        out.append("BPF atomics that fetch: fetch-add, xchg, cmpxchg (Linux 5.12)")
    if not facts.switch_prev_state:
        out.append("sched_switch's prev_state argument (Linux 5.18)")
    return out


def object_for(facts) -> str:
    """pathprof.bpf.o where the kernel has the bpf_rdonly_cast kfunc (6.2+), else pathprof-compat.bpf.o; on a kernel
    without what those two need (old_kernel_lacks: Debian 11's 5.10, anything before 5.18), pathprof-510.bpf.o."""
    if old_kernel_lacks(facts):
        return OLD_OBJECT
    return MAIN_OBJECT if facts.has_btf_func("bpf_rdonly_cast") else COMPAT_OBJECT


def conn_object_for(facts) -> str:
    """The connection probe's object (--connect): conn-510.bpf.o where pathprof-510.bpf.o is the probes' object."""
    return CONN_OLD_OBJECT if object_for(facts) == OLD_OBJECT else CONN_OBJECT


OBJECT_WHY = {
    MAIN_OBJECT: "kernel fields read by the bpf_rdonly_cast kfunc (Linux >= 6.2)",
    COMPAT_OBJECT: "no bpf_rdonly_cast kfunc (Linux < 6.2): kernel fields read with bpf_probe_read_kernel",
    OLD_OBJECT: "task and socket state in hash maps, no fetching atomics, kernel fields read with "
                "bpf_probe_read_kernel",
}


def describe_object(facts) -> str:
    """The object chosen here and why, for `doctor` and the run's notes."""
    name = object_for(facts)
    lacks = old_kernel_lacks(facts) if name == OLD_OBJECT else []
    return f"{name} ({OBJECT_WHY[name]}" + (f"; this kernel lacks {'; '.join(lacks)}" if lacks else "") + ")"


# The oldest kernel that runs every stage: what REQUIREMENTS imply, and the newest helper the objects an older kernel
# loads call unguarded (tests/unit/test_kernel_floor.py reads their code, instructions included). Before it: no BPF
# ring buffer (5.8), the first of REQUIREMENTS, on kernels that have BTF at all (5.4 on); fentry/fexit, tp_btf and
# BPF-to-BPF calls in tracing programs came in 5.5, bpf_probe_read_kernel in 5.5 as well.
MINIMUM_KERNEL = (5, 8)


# What every program family needs and no fallback replaces, with the Linux version that brought it. Checked in
# the kernel's BTF (the helper's enum value, the map type), which backports carry too, rather than by version.
# Task and socket storage, bpf_get_current_task_btf and the fetching atomics are not among them any more: the
# object for kernels without them (pathprof-510.bpf.o, object_for) does without.
REQUIREMENTS = (
    ("BPF_FUNC_ringbuf_output", "BPF ring buffers (Linux 5.8)"),
    ("BPF_MAP_TYPE_RINGBUF", "BPF ring buffer maps (Linux 5.8)"),
    ("BPF_FUNC_probe_read_kernel", "bpf_probe_read_kernel (Linux 5.5)"),
    ("BPF_FUNC_get_current_task", "bpf_get_current_task (Linux 4.8)"),
)


def kernel_shortfalls(btf_present: bool, enum_values: set[str], release: str) -> list[str]:
    """What this kernel lacks that pathprof's probes cannot do without (empty: it runs them). enum_values: the
    names of the kernel BTF's enum values (bpf_func_id, bpf_map_type); release: uname -r."""
    if not btf_present:
        return ["BTF (/sys/kernel/btf/vmlinux: a kernel built with CONFIG_DEBUG_INFO_BTF, Linux >= 5.4)"]
    return [what for name, what in REQUIREMENTS if name not in enum_values]


def release_tuple(release: str) -> tuple[int, int]:
    """uname -r -> (major, minor); (0, 0) when it does not parse."""
    try:
        major, minor = (int(x.split("-")[0]) for x in release.split(".")[:2])
    except ValueError:
        return (0, 0)
    return (major, minor)
