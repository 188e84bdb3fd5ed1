"""<run dir>/status.json while pgbench runs: what a long run is doing to the machine and to pathprof itself.

Rewritten (atomically: write + rename) every `--status-every` seconds, in a thread the progress callback starts, so
a user can `watch cat runs/<run>/status.json` and bench/soak can poll it:

    {"time", "elapsed_s", "tps", "agent_rss_kb", "agent_peak_rss_kb",
     "maps": [{"name", "type", "max_entries", "entries", "memory_bytes"}],   (with probes)
     "events": {"messages", "lost": {counter: n}, "lost_total"}}                (since the measured interval began)

`memory_bytes` is the kernel's own account of a map's memory (fdinfo `memlock`, since Linux 6.4 the map's actual
usage). `entries` is counted for hash maps (the ones that can fill) and for task and socket storage, which have
no fixed size (one entry per tracked thread or socket, freed with it; the kernel charges their elements to the
thread or socket, not to the map, so their memory is counted here as entries x (value + element overhead)).
Arrays are always full-size.
"""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

MAP_TYPES = {1: "hash", 2: "array", 5: "percpu_hash", 6: "percpu_array", 9: "lru_hash", 10: "lru_percpu_hash",
             24: "sk_storage", 27: "ringbuf", 29: "task_storage"}
HASH_TYPES = {1, 5, 9, 10}


def rss_kb(pid: int | str = "self") -> tuple[int | None, int | None]:
    """(VmRSS, VmHWM) in kB of a process."""
    vals = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(("VmRSS:", "VmHWM:")):
                vals[line.split(":")[0]] = int(line.split()[1])
    except OSError:
        pass
    return vals.get("VmRSS"), vals.get("VmHWM")


def fdinfo(fd: int) -> dict[str, int]:
    out = {}
    try:
        for line in Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines():
            k, _, v = line.partition(":")
            v = v.strip()
            if v.isdigit():
                out[k] = int(v)
    except OSError:
        pass
    return out


def map_usage(obj) -> list[dict]:
    """Every map of a loaded BpfObject: type, size, entries in use (hash maps) and memory (kernel's account)."""
    out = []
    for name, m in obj.maps.items():
        if m.fd < 0:
            continue
        info = fdinfo(m.fd)
        t = info.get("map_type")
        item = {"name": name, "type": MAP_TYPES.get(t, str(t)), "max_entries": info.get("max_entries"),
                "entries": None, "memory_bytes": info.get("memlock")}
        if t in HASH_TYPES:
            try:
                item["entries"] = len(m.items())
            except OSError:
                pass
        out.append(item)
    counted = storage_entries(obj)
    for item in out:
        if item["name"] in counted:
            m = obj.maps[item["name"]]
            item["entries"] = counted[item["name"]]
            item["memory_bytes"] = (item["memory_bytes"] or 0) + item["entries"] * (m.value_size + SELEM_OVERHEAD)
    return out


SELEM_OVERHEAD = 96      # struct bpf_local_storage_elem around each value (hlist nodes, rcu head, owner), approx.
_libc = None


def _pidfd_getfd(pidfd: int, fd: int) -> int:
    global _libc
    import ctypes
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc.syscall(438, pidfd, fd, 0)    # pidfd_getfd(2), x86_64


def storage_entries(obj) -> dict[str, int]:
    """Entries of the task and socket storage maps, counted over the agent's process tree (every process of
    the run is a descendant of pathprof: servers, hops, pgbench): a thread's storage is looked up through its
    pidfd, a socket's through a copy of its fd (pidfd_getfd). Storage of anything outside the tree is not seen."""
    from pathprof.agent.probing.session import PIDFD_THREAD, _threads_and_children, pidfd_thread_ok
    tasks, socks = obj.maps.get("tasks"), obj.maps.get("socks")
    from pathprof.agent.probing.hooks import OLD_OBJECT
    if str(getattr(obj, "path", "")).endswith(OLD_OBJECT):   # hash maps standing in for the storage: every entry
        return {"tasks": len(tasks.items()) if tasks else 0, "socks": len(socks.items()) if socks else 0}
    n_tasks = n_socks = 0
    seen_inodes: set[str] = set()
    tids = [t for t in _threads_and_children(os.getpid()) if t != os.getpid()]
    for tid in tids:
        try:
            fd = os.pidfd_open(tid, PIDFD_THREAD if pidfd_thread_ok() else 0)   # main threads only before 6.9
        except OSError:
            continue
        try:
            n_tasks += tasks is not None and tasks.lookup(fd.to_bytes(4, "little")) is not None
            if socks is None or not Path(f"/proc/{tid}/fd").exists() or Path(f"/proc/{tid}/status").read_text() \
                    .split("Tgid:")[1].split()[0] != str(tid):
                continue                  # sockets are per process: look once, from its main thread
            for entry in os.scandir(f"/proc/{tid}/fd"):
                try:
                    target = os.readlink(entry.path)
                except OSError:
                    continue
                if not target.startswith("socket:") or target in seen_inodes:
                    continue
                seen_inodes.add(target)
                sfd = _pidfd_getfd(fd, int(entry.name))
                if sfd >= 0:
                    n_socks += socks.lookup(sfd.to_bytes(4, "little")) is not None
                    os.close(sfd)
        except OSError:
            continue
        finally:
            os.close(fd)
    return {"tasks": n_tasks, "socks": n_socks}


class StatusFile:
    """Writes status.json from a thread of its own: collecting map usage takes ~80 ms at 96 clients, which must
    not hold up the progress callback (the live view, pgbench's stderr pipe). A write still in progress when the
    next is due makes that one skip, never queue."""

    def __init__(self, path: Path, probes, every_s: float, duration_s: float | None = None):
        self.path, self.probes, self.every_s, self.duration_s = path, probes, every_s, duration_s
        self._last = 0.0
        self._writer: threading.Thread | None = None

    def update(self, pr) -> None:
        """Called on each pgbench progress line; writes when every_s has passed since the last write. pgbench's
        last line can come as its clients close their connections: not a state of the running system."""
        now = time.monotonic()
        if self.every_s <= 0 or now - self._last < self.every_s:
            return
        if self.duration_s and self._last and pr.elapsed_s >= self.duration_s - 0.5:
            return
        if self._writer is not None and self._writer.is_alive():
            return
        self._last = now
        self._writer = threading.Thread(target=self._write, args=(pr, now), name="status.json", daemon=True)
        self._writer.start()

    def close(self, timeout_s: float = 5.0) -> None:
        """Waits for a write in progress (the probes it reads are about to be closed)."""
        if self._writer is not None:
            self._writer.join(timeout_s)

    def _write(self, pr, t0: float) -> None:
        rss, peak = rss_kb()
        doc = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "elapsed_s": pr.elapsed_s, "tps": pr.tps,
               "agent_rss_kb": rss, "agent_peak_rss_kb": peak}
        if self.probes is not None:
            try:
                doc.update(self.probes.status(map_usage) or {})
            except Exception:              # probes closing under us at the end of the run: skip this one
                return
        doc["collect_ms"] = round((time.monotonic() - t0) * 1e3, 1)   # what writing this status cost
        tmp = self.path.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(doc) + "\n")
            os.replace(tmp, self.path)
        except OSError:                   # a full disk costs the status file, never the run
            pass
