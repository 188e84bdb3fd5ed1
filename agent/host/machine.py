"""The machine pathprof runs on: who we are, what the host is, how busy its CPUs were."""
from __future__ import annotations

import os
import platform
import re
import socket

from pathprof.errors import RequirementError


def require_root() -> None:
    if os.geteuid() != 0:
        raise RequirementError("pathprof must run as root (it creates namespaces and loads BPF programs); "
                               "try: sudo pathprof ...")


def boot_id() -> str | None:
    """This kernel's boot (/proc/sys/kernel/random/boot_id): namespaces share it, two machines or VMs never do --
    even clones of one image, which share a hostname and /etc/machine-id."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip() or None
    except OSError:
        return None


def host_info() -> dict:
    u = platform.uname()
    osname = ""
    try:
        osname = next(l.split("=", 1)[1].strip('"\n') for l in open("/etc/os-release") if l.startswith("PRETTY_NAME"))
    except (OSError, StopIteration):
        pass
    return {"kernel": u.release, "cpus": os.cpu_count(), "hostname": socket.gethostname(), "os": osname,
            "machine": u.machine, "boot_id": boot_id()}


def net_counters(text: str, wanted: dict[str, tuple[str, ...]]) -> dict[str, int]:
    """Counters from /proc/net/snmp or /proc/net/netstat text (a header line `Group: name ...` followed by a
    value line `Group: n ...`): {name: value} for the names `wanted` lists under their group."""
    lines = [ln.split() for ln in text.splitlines()]
    out = {}
    for head, vals in zip(lines[::2], lines[1::2]):
        if not head:
            continue
        keys = wanted.get(head[0].rstrip(":"), ())
        out.update({k: int(v) for k, v in zip(head[1:], vals[1:]) if k in keys})
    return out


def proc_stat_ns() -> tuple[int, int, int]:
    """(busy, total, steal) CPU ns since boot from /proc/stat's cpu line; busy = total - idle - iowait
    (tick-sampled by the kernel: 1/HZ resolution). steal is the time a hypervisor ran something else on this
    virtual machine's CPUs while they had work: inside busy, and inside every stage that was running then."""
    with open("/proc/stat") as f:
        vals = [int(x) for x in f.readline().split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    total = sum(vals[:8])          # guest/guest_nice are already inside user/nice
    busy = total - vals[3] - vals[4]
    steal = vals[7] if len(vals) > 7 else 0
    return busy * 10**9 // hz, total * 10**9 // hz, steal * 10**9 // hz


def cpu_times() -> dict:
    """The CPUs' time since boot, all CPUs summed: {busy_ns, total_ns, asleep_ns, busy_tick_ns, steal_ns,
    busy_source}.

    busy_ns is the CPUs' time not asleep in the no-HZ idle state (total - idle - iowait sleep, ns-precise, the
    kernel's own tick_sched accounting) where the kernel keeps it; busy_tick_ns is /proc/stat's busy fields,
    which are tick samples: work that starts right after a tick (TCP's retransmission and loss-probe timers
    fire from the tick) and ends before the next is never sampled, so under loss they miss most of it.
    busy_source says which busy_ns is ("nohz", else "tick" with busy_ns = busy_tick_ns). Subtract two readings."""
    tick_busy, tick_total, steal = proc_stat_ns()
    out = {"busy_tick_ns": tick_busy, "busy_ns": tick_busy, "total_ns": tick_total, "asleep_ns": tick_total - tick_busy,
           "steal_ns": steal, "busy_source": "tick"}
    nohz = nohz_times()
    if nohz is not None:
        total, asleep = nohz
        out.update(busy_ns=total - asleep, total_ns=total, asleep_ns=asleep, busy_source="nohz")
    return out


_NOW = re.compile(r"^now at (\d+) nsecs", re.M)
_SLEPT = re.compile(r"^  \.(?:idle|iowait)_sleeptime\s*:\s*(\d+) nsecs", re.M)


def timer_list_cpu(text: str, cpu: int) -> tuple[int, int] | None:
    """(now, idle + iowait sleep) in ns for one CPU from /proc/timer_list text, None when it lacks them."""
    now = _NOW.search(text)
    head = f"\ncpu: {cpu}\n"
    if now is None or head not in text:
        return None
    section = text.split(head, 1)[1].split("\ncpu: ", 1)[0]
    slept = [int(x) for x in _SLEPT.findall(section)]
    return (int(now.group(1)), sum(slept)) if len(slept) == 2 else None


def nohz_times() -> tuple[int, int] | None:
    """(total, asleep) ns since boot over all CPUs from the kernel's no-HZ idle accounting (/proc/timer_list's
    idle_sleeptime + iowait_sleeptime, ns), None where it is not available (no NO_HZ, not root, a CPU we may
    not run on).

    That sleep time omits an idle period under way, so each CPU is read from a thread pinned to it: running
    there ends its idle period (and, inside a measurement window, puts a sched_switch out of its idle task into
    the probes' accounting at the same moment). /proc/stat's idle field is the same accounting with the period
    under way, but quantised to 10 ms (USER_HZ); the cpuidle states' `time` is µs, misses the period under way
    and the idle loop around the states."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except OSError:
        return None
    if len(cpus) != (os.cpu_count() or 0):      # restricted to a cpuset: cannot visit every CPU
        return None
    total = asleep = 0
    try:
        for cpu in cpus:
            os.sched_setaffinity(0, {cpu})       # this thread only
            with open("/proc/timer_list") as f:
                got = timer_list_cpu(f.read(), cpu)
            if got is None:
                return None
            total, asleep = total + got[0], asleep + got[1]
    except OSError:
        return None
    finally:
        try:
            os.sched_setaffinity(0, cpus)
        except OSError:
            pass
    return total, asleep
