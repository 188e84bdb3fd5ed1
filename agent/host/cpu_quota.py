"""CPU quotas (CFS bandwidth control): the cgroups that cap a run's processes, their quota, and their own count
of the time they were throttled; and `run --cpu-quota`, which puts one of pathprof's own processes under one.

A cgroup's quota (v2 `cpu.max` "QUOTA PERIOD", v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`; Kubernetes CPU limits,
systemd `CPUQuota=`, `docker run --cpus`) lets its processes run QUOTA µs of CPU per PERIOD µs across all CPUs;
once used up, the group's runnable threads wait for the next period however idle the CPUs are. The probes time
those waits per process (`throttled.<proc>`, probes/sched.bpf.h); the cgroup counts them itself (`cpu.stat`:
v2 `throttled_usec`, v1 `throttled_time` in ns, with `nr_throttled` of `nr_periods`). A quota on an ancestor caps
everything below it, so a process's cap is the nearest cgroup up its path that has one.

`--cpu-quota server=25/100` (ms of CPU per ms of period) makes a `pp-<run>-cpu` cgroup, journaled before it
is made, sets the quota and moves the owned postmaster's tree (or pgbench, `client=`; the path's hop processes,
`hop=`: a pooler, a proxy) into it; undo moves any process left back and removes it
(agent.host.io_limit.undo_cgroup, the same journal kind).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from pathprof.agent.host.io_limit import CGROUP_ROOT, _tree
from pathprof.errors import UserError

WHO = ("server", "client", "hop")
EXAMPLE = "e.g. server=25/100: 25 ms of CPU every 100 ms"


@dataclass(frozen=True)
class Quota:
    quota_us: int
    period_us: int

    def describe(self) -> str:
        return f"{self.quota_us / 1000:g} ms per {self.period_us / 1000:g} ms ({self.cpus():.2f} CPU)"

    def cpus(self) -> float:
        return self.quota_us / self.period_us


def parse(text: str) -> dict[str, Quota]:
    """'server=25/100[,client=50/100]' -> {'server': Quota(25000, 100000)}; bad input is one UserError line."""
    out: dict[str, Quota] = {}
    for item in (text or "").split(","):
        who, sep, value = item.strip().partition("=")
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*/\s*(\d+(?:\.\d+)?)\s*", value)
        if not sep or who.strip() not in WHO or not m:
            raise UserError(f"--cpu-quota '{text}': '{item.strip()}' is not WHO=QUOTA_MS/PERIOD_MS with WHO one of "
                            f"{', '.join(WHO)} ({EXAMPLE})")
        quota, period = (round(float(x) * 1000) for x in m.groups())
        if not 1000 <= period <= 1_000_000 or quota < 1000:
            raise UserError(f"--cpu-quota '{item.strip()}': the period must be 1 ... 1000 ms and the quota at least "
                            "1 ms (the kernel's limits)")
        out[who.strip()] = Quota(quota, period)
    return out


def _v1_dir() -> Path | None:
    d = CGROUP_ROOT / "cpu"
    return d if (d / "cpu.cfs_quota_us").exists() else None


def check_available() -> None:
    """Refuse early when this kernel has no CFS bandwidth control."""
    if _v1_dir() is not None:
        return
    controllers = CGROUP_ROOT / "cgroup.controllers"
    if controllers.exists() and "cpu" in controllers.read_text().split():
        return
    raise UserError("--cpu-quota needs CFS bandwidth control: a cgroup v1 'cpu' hierarchy with cpu.cfs_quota_us "
                    f"or the cgroup v2 'cpu' controller; {CGROUP_ROOT} has neither")


def cgroup_dir(pid: int) -> Path | None:
    """The directory of the cgroup that holds pid's CPU controller (v1 'cpu' hierarchy, else v2)."""
    v1 = _v1_dir()
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if v1 is not None and "cpu" in controllers.split(","):
            return v1 / path.lstrip("/")
        if v1 is None and controllers == "":
            return CGROUP_ROOT / path.lstrip("/")
    return None


def quota_of(cg: Path) -> Quota | None:
    """The cgroup's own quota, None when it has none (v1 -1, v2 'max')."""
    try:
        if (cg / "cpu.max").exists():
            q, p = (cg / "cpu.max").read_text().split()
            return None if q == "max" else Quota(int(q), int(p))
        q = int((cg / "cpu.cfs_quota_us").read_text())
        return None if q < 0 else Quota(q, int((cg / "cpu.cfs_period_us").read_text()))
    except (OSError, ValueError):
        return None


def capping(pid: int) -> tuple[Path, Quota] | None:
    """The nearest cgroup up pid's path with a quota, and the quota."""
    cg = cgroup_dir(pid)
    root = _v1_dir() or CGROUP_ROOT
    while cg is not None and str(cg).startswith(str(root)):
        q = quota_of(cg)
        if q is not None:
            return cg, q
        if cg == root:
            break
        cg = cg.parent
    return None


def counters(cg: Path) -> dict:
    """cpu.stat: {nr_periods, nr_throttled, throttled_ns} (v2 throttled_usec, v1 throttled_time ns)."""
    out = {"nr_periods": 0, "nr_throttled": 0, "throttled_ns": 0}
    try:
        for line in (cg / "cpu.stat").read_text().splitlines():
            k, _, v = line.partition(" ")
            if k in ("nr_periods", "nr_throttled"):
                out[k] = int(v)
            elif k == "throttled_usec":
                out["throttled_ns"] = int(v) * 1000
            elif k == "throttled_time":
                out["throttled_ns"] = int(v)
    except (OSError, ValueError):
        pass
    return out


class QuotaWatch:
    """The quota'd cgroups of a run's processes by role, and their counters over the measured interval."""

    def __init__(self, pids_by_role: dict[str, list[int]]):
        self.groups: dict[Path, dict] = {}
        for role, pids in pids_by_role.items():
            for pid in pids:
                found = capping(pid)
                if found:
                    cg, q = found
                    g = self.groups.setdefault(cg, {"quota": q, "roles": set()})
                    g["roles"].add(role)
        self.before = {cg: counters(cg) for cg in self.groups}

    def stop(self, seconds: float) -> list[dict]:
        """run.json `cpu_quotas`: per cgroup, its quota, the roles under it and its own counters' deltas."""
        out = []
        root = _v1_dir() or CGROUP_ROOT
        for cg, g in self.groups.items():
            now, b = counters(cg), self.before[cg]
            q = g["quota"]
            out.append({"cgroup": "/" + str(cg.relative_to(root)).lstrip("."), "roles": sorted(g["roles"]),
                        "quota_us": q.quota_us, "period_us": q.period_us, "cpus": round(q.cpus(), 3),
                        "version": 1 if _v1_dir() else 2, "seconds": round(seconds, 3),
                        **{k: now[k] - b[k] for k in now}})
        return out


def pids_by_role(pg, services, client_pid: int | None) -> dict[str, list[int]]:
    """The run's own processes by the role their stages carry."""
    out: dict[str, list[int]] = {}
    if pg is not None and getattr(pg, "pid", None):
        out["backend"] = _tree(pg.pid)
    if client_pid:
        out["pgbench"] = [client_pid]
    for svc in services:
        try:
            out.setdefault(getattr(svc, "hop", None) or getattr(svc, "role", "proxy"), []).extend(svc.pids())
        except Exception:            # a service that cannot say its pids has no quota to report
            continue
    return out


def apply(journal, run_id: str, who: str, pid: int | list[int], quota: Quota) -> Path:
    """Make the pp- cgroup with the quota and move pid's tree in (backends forked later inherit it); several pids:
    each one's tree (the path's hops)."""
    pids = [pid] if isinstance(pid, int) else list(pid)
    check_available()
    v1 = _v1_dir()
    hier = v1 if v1 is not None else CGROUP_ROOT
    cg = hier / f"pp-{run_id}-cpu-{who}"
    if cg.exists():
        raise UserError(f"cgroup {cg} already exists (run `pathprof cleanup`)")
    back = cgroup_dir(pids[0]) or hier
    if v1 is None:
        sub = CGROUP_ROOT / "cgroup.subtree_control"
        if "cpu" not in sub.read_text().split():
            journal.record("cgroup_subtree", path=str(sub), controller="cpu")
            sub.write_text("+cpu")
    journal.record("cgroup", path=str(cg), back=str(back))
    cg.mkdir()
    if v1 is not None:
        (cg / "cpu.cfs_period_us").write_text(str(quota.period_us))
        (cg / "cpu.cfs_quota_us").write_text(str(quota.quota_us))
    else:
        (cg / "cpu.max").write_text(f"{quota.quota_us} {quota.period_us}")
    procs = cg / "cgroup.procs"
    for _ in range(3):              # a child forked while we moved its parent: moved on the next pass
        for p in [t for one in pids for t in _tree(one)]:
            try:
                procs.write_text(str(p))
            except (ProcessLookupError, OSError):
                pass
    return cg

