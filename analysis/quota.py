"""CPU quotas: each quota'd cgroup of a run's processes, its own count of throttled time against the probes'
`throttled.<proc>` stages, and the words that name it in an explanation.

The two sources are independent: the probes time, per thread, each wait off CPU that began with its cgroup
throttled (probes/sched.bpf.h); the kernel's CFS bandwidth control adds up, per CPU, how long the group's run
queue there stayed throttled (cpu.stat throttled_usec / throttled_time). With one thread of the group runnable
at a time (one client's backend, a single-threaded pooler) the two are the same time seen twice: the share of
wall-clock time each spent throttled must agree. With several of its threads waiting at once the probes count
each thread's wait and the cgroup each CPU's, so they are shown side by side, not judged.

Pure functions of the run's recorded figures."""
from __future__ import annotations

# the two shares must agree within this ratio: the probes' intervals end when the thread runs again (a run-queue
# wait after the group is released is counted in), and they are measured in the windows, the cgroup's over the run
AGREE_LOW, AGREE_HIGH = 0.65, 1.5


def quota_check(quotas: list[dict], out: dict) -> list[dict]:
    """Per cgroup: {cgroup, roles, quota_us, period_us, cpus, seconds, throttled_ns, nr_throttled, nr_periods,
    cgroup_throttled_share, probes_throttled_us_per_txn, probes_throttled_share?, single_thread, agrees?}."""
    by_name: dict[str, float] = {}
    for s in out.get("stages") or []:
        if s["name"].startswith("throttled.") and not s.get("parent"):
            by_name[s["name"]] = by_name.get(s["name"], 0.0) + s["us_per_txn"]
    tps = out.get("tps") or 0.0
    clients = out.get("clients") or 1
    rows = []
    for q in quotas or []:
        row = dict(q)
        secs = q.get("seconds") or 0.0
        row["cgroup_throttled_share"] = round(q.get("throttled_ns", 0) / (secs * 1e9), 4) if secs else None
        probes_us = sum(v for n, v in by_name.items() if n.split(".", 1)[1] in q.get("roles", ()))
        row["probes_throttled_us_per_txn"] = round(probes_us, 2)
        # each connection's share of wall-clock time spent throttled: µs per transaction x transactions per
        # second per connection
        row["probes_throttled_share"] = round(probes_us * tps / clients / 1e6, 4) if tps else None
        single = clients == 1 or set(q.get("roles", ())) - {"backend", "pgbench"} == set(q.get("roles", ()))
        row["single_thread"] = bool(single)
        c, p = row["cgroup_throttled_share"], row["probes_throttled_share"]
        if single and c and p is not None and c > 0.005:
            row["agrees"] = AGREE_LOW <= p / c <= AGREE_HIGH
        rows.append(row)
    return rows


def describe(q: dict) -> str:
    """'cgroup /pp-x-cpu-server (5 ms per 100 ms = 0.05 CPU, over backend)'."""
    return (f"cgroup {q.get('cgroup')} ({q.get('quota_us', 0) / 1000:g} ms per {q.get('period_us', 0) / 1000:g} ms "
            f"= {q.get('cpus', 0):.2f} CPU, over {', '.join(q.get('roles') or []) or 'the run'})")


def quota_note(q: dict) -> str:
    """The report's line: the quota, how often it bit, and the cross-check of the two sources."""
    text = f"CPU quota: {describe(q)}"
    if q.get("nr_periods"):
        text += f" throttled the group in {q.get('nr_throttled', 0)} of {q['nr_periods']} periods"
    c, p = q.get("cgroup_throttled_share"), q.get("probes_throttled_share")
    if c is not None:
        text += f", {100 * c:.0f} % of the time by its cpu.stat"
    if p is not None:
        text += f"; the probes' throttled.* stages: {q.get('probes_throttled_us_per_txn', 0):,.1f} µs per " \
                f"transaction, {100 * p:.0f} % of each connection's time"
    if "agrees" in q:
        text += " (the two agree)" if q["agrees"] else (" (they DISAGREE: a throttled wait the probes missed, or "
                                                         "one they counted that was not the quota's)")
    elif c is not None and p is not None:
        text += " (several of its threads wait at once: the cgroup counts per CPU, the probes per thread)"
    return text


def cause_detail(summaries: list, names: list[str]) -> str | None:
    """The quota'd cgroups behind the throttled.<proc> items of a cause, from either run's cpu_quotas."""
    procs = {n.split(".", 1)[1] for n in names if n.startswith("throttled.")}
    seen, parts = set(), []
    for s in summaries:
        for q in (s.get("cpu_quotas") if isinstance(s, dict) else getattr(s, "cpu_quotas", None)) or []:
            if procs & set(q.get("roles") or ()) and q.get("cgroup") not in seen:
                seen.add(q.get("cgroup"))
                parts.append(describe(q))
    return "; ".join(parts) or None
