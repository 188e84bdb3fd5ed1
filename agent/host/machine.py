"""The machine pathprof runs on: who we are, what the host is, how busy its CPUs were."""
from __future__ import annotations

import os
import platform
import socket

from pathprof.errors import RequirementError


def require_root() -> None:
    if os.geteuid() != 0:
        raise RequirementError("pathprof must run as root (it creates namespaces and loads BPF programs); "
                               "try: sudo pathprof ...")


def host_info() -> dict:
    u = platform.uname()
    osname = ""
    try:
        osname = next(l.split("=", 1)[1].strip('"\n') for l in open("/etc/os-release") if l.startswith("PRETTY_NAME"))
    except (OSError, StopIteration):
        pass
    return {"kernel": u.release, "cpus": os.cpu_count(), "hostname": socket.gethostname(), "os": osname,
            "machine": u.machine}


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


def cpu_busy_ns() -> tuple[int, int]:
    """(busy, total) CPU ns since boot from /proc/stat's cpu line; busy = total - idle - iowait
    (tick-sampled by the kernel: 1/HZ resolution)."""
    with open("/proc/stat") as f:
        vals = [int(x) for x in f.readline().split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    total = sum(vals[:8])          # guest/guest_nice are already inside user/nice
    busy = total - vals[3] - vals[4]
    return busy * 10**9 // hz, total * 10**9 // hz
