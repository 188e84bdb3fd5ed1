"""A slow WAL device: the kernel's block I/O throttle on the WAL's loop device, for the owned server only.

This kernel has no device-mapper (no /dev/mapper/control), so dm-delay cannot add latency to a device. What it
has is the cgroup block I/O throttle (blk-throttle): a cgroup holds a limit of reads/writes per second or bytes
per second *per device* (MAJ:MIN), and every bio a member process submits to that device waits in the
throttle's queue until the limit allows it. pathprof makes a `pp-<run>` cgroup, puts the owned postmaster and
its children in it (backends forked later inherit it), and sets the limit on the WAL's loop device only: the
data directory, other devices and every other process on the machine are untouched.

Where the throttled time lands: a commit's fdatasync() submits the WAL write and a cache flush, then sleeps
until they complete. The throttle holds the bios *before* a block request exists, so block_rq_issue (and the
disk view's device time) only starts once the throttle lets a bio go: the wait is off-CPU time inside
`backend.wal_flush`, not device time. Writes the kernel's flusher threads make on their own (dirty page
writeback) are not charged to the cgroup on cgroup v1 and escape the limit; PostgreSQL's WAL is written and
fdatasync'ed by the backends and the WAL writer themselves, so it does not.

cgroup v1 (`blkio` hierarchy: blkio.throttle.*_device files) and v2 (`io` controller: io.max) are supported;
on v2 the io controller is enabled in the root's cgroup.subtree_control when it is not (journaled, restored).
Both the cgroup and that change are journaled before they are made; undo moves any process still inside back
to where the postmaster came from and removes the cgroup.
"""
from __future__ import annotations

import os
import re
import time
from pathlib import Path

from pathprof.errors import UserError

CGROUP_ROOT = Path(os.environ.get("PATHPROF_CGROUP_ROOT", "/sys/fs/cgroup"))
KEYS = ("riops", "wiops", "rbps", "wbps")
V1_FILES = {"riops": "blkio.throttle.read_iops_device", "wiops": "blkio.throttle.write_iops_device",
            "rbps": "blkio.throttle.read_bps_device", "wbps": "blkio.throttle.write_bps_device"}
_SUFFIX = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
EXAMPLE = "e.g. wiops=200 or wiops=200,wbps=4M"


def parse_limits(text: str) -> dict[str, int]:
    """'wiops=200,wbps=4M' -> {'wiops': 200, 'wbps': 4194304}; bad input is one UserError line."""
    out: dict[str, int] = {}
    for item in (text or "").split(","):
        key, sep, value = item.strip().partition("=")
        key = key.strip().lower()
        if not sep or key not in KEYS:
            raise UserError(f"--wal-device-limit '{text}': '{item.strip()}' is not one of "
                            f"{', '.join(k + '=N' for k in KEYS)} ({EXAMPLE})")
        m = re.fullmatch(r"\s*(\d+)\s*([kKmMgG]?)\s*", value)
        if not m or (m.group(2) and key.endswith("iops")):
            raise UserError(f"--wal-device-limit '{text}': {key} takes a whole number"
                            f"{' (bytes; K, M, G suffixes)' if key.endswith('bps') else ''}, not '{value}'")
        n = int(m.group(1)) * _SUFFIX[m.group(2).lower()]
        if n < 1:
            raise UserError(f"--wal-device-limit '{text}': {key} must be at least 1")
        out[key] = n
    return out


def describe(limits: dict[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in limits.items())


def _v2() -> bool:
    return (CGROUP_ROOT / "cgroup.controllers").exists()


def _v1_dir() -> Path | None:
    d = CGROUP_ROOT / "blkio"
    return d if (d / V1_FILES["wiops"]).exists() else None


def check_available() -> None:
    """Refuse early (before anything is built) when this kernel cannot throttle a device."""
    if _v1_dir() is not None:
        return
    if _v2() and "io" in (CGROUP_ROOT / "cgroup.controllers").read_text().split():
        return
    raise UserError("--wal-device-limit needs the kernel's block I/O throttle: a cgroup v1 'blkio' hierarchy "
                    f"with blkio.throttle.* files or the cgroup v2 'io' controller; {CGROUP_ROOT} has neither "
                    "(kernel built without CONFIG_BLK_DEV_THROTTLING?)")


def _own_cgroup(pid: int, v1: bool) -> str:
    """The process's cgroup path in the hierarchy we use ('/' when not found)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if (v1 and "blkio" in controllers.split(",")) or (not v1 and controllers == ""):
            return path or "/"
    return "/"


def _tree(pid: int) -> list[int]:
    """pid and its descendants now (PostgreSQL's processes are single-threaded: children are processes)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            todo += [int(c) for c in Path(f"/proc/{p}/task/{p}/children").read_text().split()]
        except OSError:
            pass
    return out


def apply(journal, run_id: str, device: str, postmaster_pid: int, limits: dict[str, int]) -> Path:
    """Make the pp- cgroup, set the limits on `device` (e.g. /dev/loop3), move the postmaster's tree in."""
    check_available()
    majmin = Path(f"/sys/class/block/{Path(device).name}/dev").read_text().strip()
    v1dir = _v1_dir()
    hier = v1dir if v1dir is not None else CGROUP_ROOT
    back = _own_cgroup(postmaster_pid, v1=v1dir is not None)
    cg = hier / f"pp-{run_id}"
    if cg.exists():
        raise UserError(f"cgroup {cg} already exists (run `pathprof cleanup`)")
    if v1dir is None:
        sub = CGROUP_ROOT / "cgroup.subtree_control"
        if "io" not in sub.read_text().split():
            journal.record("cgroup_subtree", path=str(sub), controller="io")
            sub.write_text("+io")
    journal.record("cgroup", path=str(cg), back=str(hier / back.lstrip("/")))
    cg.mkdir()
    if v1dir is not None:
        for key, value in limits.items():
            (cg / V1_FILES[key]).write_text(f"{majmin} {value}")
    else:
        (cg / "io.max").write_text(f"{majmin} " + " ".join(f"{k}={v}" for k, v in limits.items()))
    procs = cg / "cgroup.procs"
    for _ in range(3):              # a child forked while we moved its parent: move it on the next pass
        for pid in _tree(postmaster_pid):
            try:
                procs.write_text(str(pid))
            except ProcessLookupError:
                pass
    return cg


def members(cg: Path) -> list[int]:
    try:
        return [int(p) for p in (cg / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def undo_cgroup(path: str, back: str | None) -> bool:
    """Move whatever is still inside back to `back` (its hierarchy's root if that is gone), remove the cgroup."""
    cg = Path(path)
    if not cg.exists():
        return True
    dest = Path(back) if back and Path(back, "cgroup.procs").exists() else cg.parent
    for _ in range(5):
        for pid in members(cg):
            try:
                (dest / "cgroup.procs").write_text(str(pid))
            except OSError:
                pass
        try:
            cg.rmdir()
            return True
        except OSError:
            time.sleep(0.1)         # an exiting process still counted, or one forked while we moved
    return not cg.exists()


def undo_subtree(path: str, controller: str) -> bool:
    """Disable the controller again; refused (and left) when a cgroup below still uses it."""
    p = Path(path)
    if not p.exists() or controller not in p.read_text().split():
        return True
    try:
        p.write_text(f"-{controller}")
    except OSError:
        return False
    return True


def leftover_cgroups() -> list[Path]:
    """pp- cgroups in the hierarchies pathprof uses (for `pathprof cleanup`'s sweep): block I/O and CPU limits."""
    found = []
    for hier in (CGROUP_ROOT / "blkio", CGROUP_ROOT / "cpu", CGROUP_ROOT):   # cpu: run --cpu-quota
        if hier.is_dir():
            found += sorted(p for p in hier.glob("pp-*") if p.is_dir())
    return found


def serviced(cg: str | Path, device: str) -> dict[str, int]:
    """Requests the throttle let through to `device` for the cgroup so far: {'reads': n, 'writes': n}
    (every one of them was counted against the limit; v1 blkio.throttle.io_serviced, v2 io.stat)."""
    cg = Path(cg)
    majmin = Path(f"/sys/class/block/{Path(device).name}/dev").read_text().strip()
    out = {"reads": 0, "writes": 0}
    try:
        if (cg / "blkio.throttle.io_serviced").exists():
            for line in (cg / "blkio.throttle.io_serviced").read_text().splitlines():
                parts = line.split()
                if len(parts) == 3 and parts[0] == majmin and parts[1] in ("Read", "Write"):
                    out["reads" if parts[1] == "Read" else "writes"] = int(parts[2])
        else:
            for line in (cg / "io.stat").read_text().splitlines():
                if line.startswith(majmin + " "):
                    kv = dict(p.split("=", 1) for p in line.split()[1:])
                    out = {"reads": int(kv.get("rios", 0)), "writes": int(kv.get("wios", 0))}
    except OSError:
        pass
    return out
