"""`pathprof doctor`: probe every kernel/host capability pathprof uses, at run time, and say which are missing.

Each check really exercises the capability where that is cheap (load and attach a program of each type,
create and close a netfilter link in pathprof's own namespace), instead of guessing from kernel versions.
Tracepoints are looked up in the kernel's BTF (what tp_btf attaches through), not in tracefs; an event with more
than one way to get it (pathprof.agent.probing.hooks) gets a "hook:" line naming the way this kernel gives it and
the ways it could not use; a tracepoint with no fallback costs only the stage that needs it.
"""
from __future__ import annotations

import io
import json
import os
import struct
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from pathprof.errors import RequirementError

BTF_FILE = "/sys/kernel/btf/vmlinux"

POSTGRES_BIN = "/usr/lib/postgresql/15/bin/postgres"
TRACEFS = "/sys/kernel/tracing"
# tracepoints the probes attach to; the first two carry every view, the rest one stage each
# (sk_data_ready, sock_recv_length, sock_send_length and tcp_sendmsg_locked have fallbacks: their "hook:" lines)
TRACEPOINTS = ["sched_switch", "sched_process_fork", "sched_wakeup", "sched_wakeup_new", "softirq_entry",
               "softirq_exit", "net_dev_start_xmit", "netif_receive_skb", "tcp_rcv_space_adjust", "consume_skb"]
CORE_TRACEPOINTS = {"sched_switch", "sched_process_fork"}
DEEP_ONLY = {"uprobes", "usdt notes", "usdt attach"}


@dataclass
class Capability:
    name: str
    ok: bool
    detail: str
    required: bool = True      # required for --probes basic (deep adds DEEP_ONLY)

    def to_json(self) -> dict:
        return {"name": self.name, "ok": self.ok, "detail": self.detail}


def _probes_dir() -> Path:
    # The probe objects' package itself: importing pathprof.agent.probing.session for this would import pandas too,
    # which a run then cannot overlap with these checks.
    try:
        import pathprof.probes as pp
        return Path(pp.__file__).resolve().parent
    except Exception:  # pragma: no cover
        from pathprof.agent.probing.session import _probes_dir as d
        return d()


def usdt_notes(path: str) -> list[tuple[str, str]]:
    """(provider, name) of every SystemTap SDT note in an ELF file's .note.stapsdt section."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise ValueError(f"{path} is not a 64-bit ELF file")
    e = "<" if data[5] == 1 else ">"
    shoff, = struct.unpack_from(e + "Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from(e + "HHH", data, 0x3A)
    secs = [struct.unpack_from(e + "IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab = secs[shstrndx]

    def secname(s):
        off = strtab[4] + s[0]
        return data[off:data.index(b"\0", off)].decode()

    out = []
    for s in secs:
        if secname(s) != ".note.stapsdt":
            continue
        pos, end = s[4], s[4] + s[5]
        while pos + 12 <= end:
            namesz, descsz, ntype = struct.unpack_from(e + "III", data, pos)
            desc = pos + 12 + ((namesz + 3) & ~3)
            if ntype == 3:   # NT_STAPSDT: pc, base, semaphore (3 x 8 bytes), then provider\0 name\0 args\0
                strs = data[desc + 24:desc + descsz].split(b"\0")
                if len(strs) >= 2:
                    out.append((strs[0].decode(), strs[1].decode()))
            pos = desc + ((descsz + 3) & ~3)
    return out


def _tracefs_ok() -> tuple[bool, str]:
    if os.path.isdir(f"{TRACEFS}/events"):
        return True, f"mounted at {TRACEFS}"
    if not os.path.isdir(TRACEFS):
        return False, f"{TRACEFS} does not exist (sysfs not mounted here?)"
    rc = subprocess.run(["mount", "-t", "tracefs", "tracefs", TRACEFS], capture_output=True, text=True)
    if rc.returncode == 0 and os.path.isdir(f"{TRACEFS}/events"):
        return True, f"was not mounted; mounted at {TRACEFS}"
    return False, f"not mounted and mounting failed: {rc.stderr.strip() or rc.returncode}"


def _try(fn) -> tuple[bool, str]:
    try:
        return True, fn() or "ok"
    except Exception as e:  # each check reports its own failure; doctor never raises
        return False, str(e).splitlines()[0] if str(e) else type(e).__name__


def with_prog(prog: str, fn):
    """Load doctor.bpf.o with only `prog` in it and call fn(object); the object is closed after."""
    from pathprof.agent.probing.bpf import libbpf as lb
    o = lb.BpfObject(str(_probes_dir() / "doctor.bpf.o"))
    try:
        for n, p in o.programs.items():
            p.set_autoload(n == prog)
            if n == "dr_netfilter":
                p.set_type(lb.BPF_PROG_TYPE_NETFILTER, lb.BPF_NETFILTER)
        o.load()
        return fn(o)
    finally:
        o.close()


def try_fentry() -> str | None:
    """None when an fentry program loads and attaches on this kernel, else the reason (pathprof.agent.probing.hooks
    asks before it chooses an fentry/fexit way)."""
    ok, detail = _try(lambda: with_prog("dr_fentry", lambda o: o.attach("dr_fentry") and "attached"))
    return None if ok else detail


def _bpf_checks(postgres_bin: str) -> list[Capability]:
    from pathprof.agent.probing.bpf import libbpf as lb
    caps = []

    caps.append(Capability("tp_btf", *_try(lambda: with_prog("dr_tp_btf", lambda o: o.attach("dr_tp_btf") and
                                                                   "tp_btf/sched_wakeup_new attached"))))
    caps.append(Capability("raw tracepoint", *_try(lambda: with_prog(
        "dr_raw_tp", lambda o: o.attach("dr_raw_tp") and "raw_tp/sched_wakeup_new attached")), required=False))
    caps.append(Capability("tracepoint (perf)", *_try(lambda: with_prog("dr_tracepoint", lambda o: o.attach(
        "dr_tracepoint") and "tracepoint/sched/sched_wakeup_new attached")), required=False))
    up = os.path.isdir("/sys/bus/event_source/devices/uprobe")
    caps.append(Capability("uprobes", up, "uprobe PMU present" if up else "no uprobe PMU (CONFIG_UPROBE_EVENTS)",
                           required=False))
    if os.path.exists(postgres_bin):
        caps.append(Capability("usdt attach", *_try(lambda: with_prog("dr_usdt", lambda o: o.attach(
            "dr_usdt", "usdt", -1, postgres_bin, "postgresql", "query__start") and
            f"postgresql:query__start in {postgres_bin}")), required=False))
    caps.append(Capability("bpf_stats", *_try(lambda: os.close(lb.enable_stats()) or
                                              "BPF_ENABLE_STATS (per-program run_time_ns/run_cnt)"), required=False))

    def nf_link():
        def link(o):   # in our own namespace, at the hook's first priority, closed at once
            os.close(lb.netfilter_link(o.programs["dr_netfilter"].fd, 3, lb.NF_PRI_FIRST, None))
            return "BPF_LINK_CREATE netfilter (type 32/attach 45) at INT_MIN+1"
        return with_prog("dr_netfilter", link)
    caps.append(Capability("netfilter links", *_try(nf_link), required=False))
    fentry = try_fentry()
    caps.append(Capability("fentry/fexit", fentry is None, "fentry/sock_def_readable attached (the fallback of "
                           "tracepoints this kernel lacks)" if fentry is None else f"refused: {fentry}",
                           required=False))
    kp = os.path.isdir("/sys/bus/event_source/devices/kprobe")
    caps.append(Capability("kprobes", *(_try(lambda: with_prog("dr_kprobe", lambda o: o.attach("dr_kprobe") and
                                                               "kprobe/sock_def_readable attached"))
                                        if kp else (False, "absent (no kprobe PMU)")), required=False))
    caps += _hook_checks()
    return caps


def _hook_checks() -> list[Capability]:
    """Per event with more than one way: the way this kernel gives it (pathprof.agent.probing.hooks), and the
    object variant chosen for it."""
    from pathprof.agent.probing import hooks
    from pathprof.agent.probing.bpf.libbpf import BpfObject
    facts = hooks.kernel_facts()
    name = hooks.object_for(facts)
    caps = [Capability("probe object", True, name if name == hooks.MAIN_OBJECT else hooks.describe_object(facts),
                       required=False)]
    for path in (name, hooks.conn_object_for(facts)):
        o = BpfObject(str(_probes_dir() / path))
        try:
            choices = hooks.choose({n: p.section for n, p in o.programs.items()}, facts)
        finally:
            o.close()
        caps += [Capability(f"hook: {label}", ok, detail, required=False)
                 for label, ok, detail in hooks.describe_choices(choices)]
    from pathprof.agent.probing.bpf import uprobe_multi
    usdt = hooks.usdt_record(uprobe_multi.supported())
    caps.append(Capability("hook: PostgreSQL USDT (--probes deep)", True, usdt["hook"] + "".join(
        f" (not {r['hook']}: {r['why']})" for r in usdt["refused"]), required=False))
    lacking = {d["feature"]: d for d in hooks.degraded(facts)}
    for helper, (what, since, effect) in hooks.OPTIONAL_HELPERS.items():
        caps.append(Capability(f"helper: {what}", what not in lacking, f"{since}: present" if what not in lacking
                               else f"missing ({since}): {effect}", required=False))
    if facts.lacks:
        caps.append(Capability("pretended lacks", False, f"{hooks.LACKS_ENV}={','.join(sorted(facts.lacks))}: this "
                               "kernel is taken to lack these", required=False))
    return caps


def check_capabilities(postgres_bin: str = POSTGRES_BIN) -> list[Capability]:
    caps = [Capability("root", os.geteuid() == 0, "running as root" if os.geteuid() == 0 else
                       "pathprof needs root (BPF, namespaces)")]
    btf = os.path.exists(BTF_FILE)
    caps.append(Capability("btf", btf, "/sys/kernel/btf/vmlinux" if btf else
                           "kernel has no BTF (CONFIG_DEBUG_INFO_BTF)"))
    tok, tdetail = _tracefs_ok()
    caps.append(Capability("tracefs", tok, tdetail + " (bpftrace scripts only)", required=False))
    if btf:                      # (without BTF the line above says what is missing)
        caps.append(_minimum_kernel(btf))
    if btf:
        from pathprof.agent.probing.bpf.libbpf import kernel_has_tracepoint
        for tp in TRACEPOINTS:
            here = kernel_has_tracepoint(tp)
            caps.append(Capability(f"tracepoint {tp}", here, "in kernel BTF" if here else
                                   ("missing: " + ("no view without it" if tp in CORE_TRACEPOINTS else
                                                   "the stage that needs it is dropped")),
                                   required=tp in CORE_TRACEPOINTS))
    objs = [p for p in ("pathprof.bpf.o", "doctor.bpf.o") if not (_probes_dir() / p).exists()]
    caps.append(Capability("probe objects", not objs, "built" if not objs else
                           f"missing {', '.join(objs)}: run `make -C probes` (needs clang, bpftool)"))
    if caps[0].ok and not objs:
        caps += _bpf_checks(postgres_bin)
    try:
        notes = usdt_notes(postgres_bin)
        pg = sum(1 for p, _ in notes if p == "postgresql")
        caps.append(Capability("usdt notes", pg > 0, f"{pg} postgresql probes in {postgres_bin}", required=False))
    except (OSError, ValueError) as e:
        caps.append(Capability("usdt notes", False, str(e), required=False))
    kvm = _can_open("/dev/kvm")
    caps.append(Capability("kvm", kvm, "/dev/kvm usable" if kvm else "no usable /dev/kvm: guests run under TCG "
                           "(information)", required=False))
    vh = os.path.exists("/dev/vhost-net")
    caps.append(Capability("vhost-net", vh, "/dev/vhost-net present" if vh else "absent (information)",
                           required=False))
    from pathprof.agent.host.io_limit import check_available
    throttle, tdetail = _try(check_available)
    caps.append(Capability("block I/O throttle", throttle, ("cgroup blkio/io throttle: --wal-device-limit works"
                           if throttle else tdetail), required=False))
    dm = _device_mapper()
    caps.append(Capability("device-mapper", dm, "present (not used: --wal-device-limit throttles instead)" if dm else
                           "absent: no dm-delay; a slow device is emulated with the block I/O throttle",
                           required=False))
    caps.append(_delay_line())
    return caps


def _minimum_kernel(btf: bool) -> Capability:
    import platform

    from pathprof.agent.probing import hooks
    from pathprof.agent.probing.bpf.libbpf import kernel_enum_values
    lacks = hooks.kernel_shortfalls(btf, kernel_enum_values("bpf_func_id", "bpf_map_type") if btf else set(),
                                    platform.release())
    return Capability("minimum kernel", not lacks, f"Linux {platform.release()} has what the probes need" if not lacks
                      else f"Linux {platform.release()} lacks " + "; ".join(lacks))


def _device_mapper() -> bool:
    """The kernel's device-mapper driver registered (a /dev/mapper/control node alone is not enough: opening it
    without the driver fails with ENODEV)."""
    try:
        return any(line.split()[1:] == ["device-mapper"] for line in open("/proc/misc"))
    except OSError:
        return False


def _delay_line() -> Capability:
    """Link impairments (--link, netem tables): pathprof's delay line (NFQUEUE + pp-delayline)."""
    try:
        from pathprof.agent.host.delayline import delayline_binary
        delayline_binary()
    except Exception as e:   # RequirementError: not built
        return Capability("link delay line", False, f"{e}; --link delays are refused", required=False)
    if not os.path.exists("/proc/net/netfilter/nfnetlink_queue"):
        return Capability("link delay line", False, "no NFQUEUE in this kernel (CONFIG_NETFILTER_NETLINK_QUEUE): "
                          "--link delays fail to hold packets", required=False)
    return Capability("link delay line", True, "pp-delayline built, NFQUEUE present (sch_netem is not needed)",
                      required=False)


def _can_open(path: str) -> bool:
    try:
        os.close(os.open(path, os.O_RDWR))
        return True
    except OSError:
        return False


def missing(caps: list[Capability], level: str) -> list[Capability]:
    if level == "off":
        return []
    return [c for c in caps if not c.ok and (c.required or (level == "deep" and c.name in DEEP_ONLY))]


def render_capabilities(caps: list[Capability]) -> str:
    from rich.console import Console
    from rich.table import Table
    t = Table(title="pathprof doctor", show_lines=False)
    t.add_column("capability")
    t.add_column("ok")
    t.add_column("needed for")
    t.add_column("detail", overflow="fold")
    for c in caps:
        need = "basic" if c.required else ("deep" if c.name in DEEP_ONLY else "-")
        mark = "[green]yes[/]" if c.ok else ("[red]NO[/]" if need != "-" else "[yellow]no[/]")
        t.add_row(c.name, mark, need, c.detail)
    buf = io.StringIO()
    Console(file=buf, width=120, force_terminal=False).print(t)
    return buf.getvalue()


def to_json(caps: list[Capability]) -> dict:
    return {"capabilities": [c.to_json() for c in caps]}


# A run's gate remembers a pass until the next boot (tmpfs), keyed by what could change it: the kernel, the
# probe objects, the postgres binary. The checks load and attach test programs: about half a second per run.
PASSED_DIR = Path("/run/pathprof/doctor")


def _pass_key(level: str) -> str:
    import hashlib
    try:
        boot = open("/proc/sys/kernel/random/boot_id").read().strip()
    except OSError:
        boot = "unknown-boot"
    parts = [level, boot, os.uname().release, str(os.geteuid())]
    for p in (_probes_dir() / "pathprof.bpf.o", _probes_dir() / "pathprof-compat.bpf.o", _probes_dir() / "doctor.bpf.o",
              Path(POSTGRES_BIN)):
        try:
            st = p.stat()
            parts += [str(p), str(st.st_size), str(st.st_mtime_ns)]
        except OSError:
            parts += [str(p), "missing"]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:24]


def require(level: str) -> list[dict]:
    """Refuse early, with the doctor's words, when --probes LEVEL cannot work here; else the capabilities found
    (run.json probes.capabilities). A pass is remembered, with its capabilities, for this boot and these probe
    objects; `pathprof doctor` itself always checks everything."""
    if level == "off":
        return []
    passed = PASSED_DIR / _pass_key(level)
    if os.path.exists(BTF_FILE):     # (BTF checked anyway: a mount namespace can hide what the pass saw)
        try:
            return json.loads(passed.read_text())["capabilities"]
        except (OSError, ValueError, KeyError, TypeError):
            pass                     # no pass yet (or one from a pathprof that kept no capabilities)
    caps = check_capabilities()
    miss = missing(caps, level)
    if miss:
        raise RequirementError(f"--probes {level} needs: " + "; ".join(f"{c.name} ({c.detail})" for c in miss)
                               + ". Run `pathprof doctor` for the full list, or use --probes off")
    found = to_json(caps)
    try:
        PASSED_DIR.mkdir(parents=True, exist_ok=True)
        passed.write_text(json.dumps(found))
    except OSError:
        pass
    return found["capabilities"]


__all__ = ["Capability", "check_capabilities", "render_capabilities", "require", "missing", "to_json",
           "usdt_notes", "asdict"]
