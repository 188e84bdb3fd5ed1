"""The CPU view of a merged run (pathprof.analysis.merge): every host's CPU components, per transaction, each
named with its host, closing against the busy time of the machines they ran on.

Each host's agent accounts its own processes (user/sys per role and hop) and, machine-wide, softirq, netfilter
and `other` (CPU time of the tasks it did not track). Hosts on different machines add up: their components sit
side by side (a name several hosts have is named per host, `softirq.net@host`; `other` is summed) and the busy
time is the sum of the machines'. Hosts that are namespaces of one machine (the same boot id) saw the same
kernel: its machine-wide components and busy time are taken once (from the first of its hosts), and its
`other` loses what the machine's other agents tracked (each agent's `other` held the others' processes).
Every host's table is scaled to the first host's transactions, as the stages are."""
from __future__ import annotations

import pandas as pd

TRACKED = ("user", "sys")        # a host's own processes; every other component is machine-wide


def machine_of(host) -> str:
    """The machine (the kernel) a host's run was recorded on, as a key: its boot id (attach's scope, else run.json
    host), which namespaces of one kernel share and two machines never do -- even two VMs cloned from one image,
    with one hostname and one /etc/machine-id; the hostname for runs recorded before the boot id was."""
    m = host.rd.meta
    scope, info = m.get("scope") or {}, m.get("host") or {}
    boot = scope.get("boot_id") or info.get("boot_id")
    return f"boot:{boot}" if boot else f"host:{_hostname(host)}"


def _hostname(host) -> str:
    m = host.rd.meta
    return str((m.get("scope") or {}).get("hostname") or (m.get("host") or {}).get("hostname") or host.name)


def machine_names(machines: dict[str, list]) -> dict[str, str]:
    """key -> the machine's name: its hostname, with its boot id where two machines share one."""
    names = {k: _hostname(hs[0]) for k, hs in machines.items()}
    return {k: n if list(names.values()).count(n) == 1 or not k.startswith("boot:") else f"{n} (boot {k[5:13]})"
            for k, n in names.items()}


def _machine_rows(hs: list, n: int, machine: str) -> tuple[list[pd.DataFrame], dict]:
    """One machine's rows (tracked per host, machine-wide once) and its busy time, scaled to n transactions."""
    frames, tracked_others = [], 0.0
    for i, h in enumerate(hs):
        cpu, f = h.rd.read_frame("cpu.parquet"), n / h.txns
        own = cpu[cpu["comp"].isin(TRACKED)].assign(host=h.name)
        frames.append(own.assign(ns=(own["ns"] * f).round().astype("int64")))
        if i:
            tracked_others += float(own["ns"].sum()) * f
    first = hs[0]
    f = n / first.txns
    wide = first.rd.read_frame("cpu.parquet")
    wide = wide[~wide["comp"].isin(TRACKED)].assign(host=machine if len(hs) > 1 else first.name)
    ns = wide["ns"].astype(float) * f
    other = wide["comp"] == "other"
    ns[other] = (ns[other] - tracked_others).clip(lower=0.0)       # the machine's other agents' processes
    frames.append(wide.assign(ns=ns.round().astype("int64")))
    cput = first.rd.meta.get("cpu") or {}
    ncpu = cput.get("ncpu") or (first.rd.meta.get("host") or {}).get("cpus") or 1
    busy = {"busy_ns": float(first.busy_ns or 0) * f, "ncpu": int(ncpu),
            "busy_tick_ns": float(getattr(first, "busy_tick_ns", None) or first.busy_ns or 0) * f,
            "busy_source": getattr(first, "busy_source", "tick")}
    return frames, busy


def merged_cpu(hosts: list, n: int) -> tuple[pd.DataFrame | None, dict | None, str]:
    """(cpu.parquet, run.json `cpu`, a note) of the merged run; (None, None, why) when a host has no CPU table."""
    missing = [h.name for h in hosts if h.rd.read_frame("cpu.parquet") is None or not h.busy_ns]
    if missing:
        return None, None, f"CPU view: {', '.join(missing)} recorded no CPU table; see each host's own run"
    machines: dict[str, list] = {}
    for h in hosts:
        machines.setdefault(machine_of(h), []).append(h)
    frames, busy_ns, tick_ns, ncpu, sources = [], 0.0, 0.0, 0, set()
    names = machine_names(machines)
    for key, hs in machines.items():
        fr, b = _machine_rows(hs, n, names[key])
        frames += fr
        busy_ns += b["busy_ns"]
        tick_ns += b["busy_tick_ns"]
        ncpu += b["ncpu"]
        sources.add(b["busy_source"])
    # every machine's busy time from its no-HZ idle time (its `idle` row then stands for its waking from idle),
    # else the tick-sampled busy time of them all, without the `idle` rows that only the no-HZ one carries
    source = "nohz" if sources == {"nohz"} else "tick"
    doc = {"busy_ns": int(round(busy_ns if source == "nohz" else tick_ns)), "elapsed_ns": hosts[0].elapsed_ns,
           "ncpu": ncpu, "busy_source": source, "busy_tick_ns": int(round(tick_ns)),
           "machines": {names[k]: [h.name for h in hs] for k, hs in machines.items()}}
    if source == "tick":
        frames = [fr[fr["comp"] != "idle"] for fr in frames]
    shared = [f"{names[k]} ({', '.join(h.name for h in hs)})" for k, hs in machines.items() if len(hs) > 1]
    note = ("CPU view: every host's components per transaction, named with their host; busy time of "
            + (f"{len(machines)} machines, summed" if len(machines) > 1 else "one machine")
            + (f"; hosts sharing a machine counted once for its kernel's work: {'; '.join(shared)}" if shared
               else ""))
    return pd.concat(frames, ignore_index=True), doc, note


def merged_probe_cost(hosts: list, n: int) -> dict | None:
    """The probes' run time of every host's agent, scaled to n transactions (they add up: each agent ran its
    own programs)."""
    total, cnt = 0.0, 0.0
    for h in hosts:
        cost = (h.rd.meta.get("probes") or {}).get("cost") or {}
        if cost.get("run_time_ns") is None:
            return None
        total += float(cost["run_time_ns"]) * n / h.txns
        cnt += float(cost.get("run_cnt") or 0) * n / h.txns
    return {"run_time_ns": int(round(total)), "run_cnt": int(round(cnt))}
