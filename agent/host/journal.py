"""The journal: every object pathprof creates on the host is written here *before* it is created.

Teardown replays the journal backwards. A run killed with SIGKILL leaves its journal behind, and
`pathprof cleanup` replays it later, so the machine gets back exactly what it had.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from pathprof.agent.host import proc
from pathprof.agent.host.netns import netns_argv
from pathprof.agent.host.proc import pid_alive, pid_start_time

JOURNAL_DIR = Path(os.environ.get("PATHPROF_STATE", "/var/lib/pathprof")) / "journal"
PREFIX = "pp-"
MARK_ENV = "PATHPROF_JOURNAL_MARK"   # in the environment of every process Journal.spawn starts
# Only directories under these roots may be removed by a journal replay.
REMOVABLE_ROOTS = (Path(os.environ.get("PATHPROF_STATE", "/var/lib/pathprof")), Path("/tmp"), Path("/run/pathprof"))


def _quiet(argv: list[str]) -> bool:
    return subprocess.run(argv, capture_output=True, timeout=30, stdin=subprocess.DEVNULL).returncode == 0


class Journal:
    def __init__(self, run_id: str, directory: Path | None = None):
        self.run_id = run_id
        self.dir = directory or JOURNAL_DIR
        self.path = self.dir / f"{run_id}.jsonl"
        self._entries: list[dict] = []

    @classmethod
    def load(cls, path: Path) -> "Journal":
        j = cls(path.stem, path.parent)
        for line in path.read_text().splitlines():
            line = line.strip()
            if not line:
                continue
            try:
                j._entries.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a torn last line from a killed writer: everything before it is still good
        return j

    @property
    def entries(self) -> list[dict]:
        return list(self._entries)

    def record(self, kind: str, **fields) -> dict:
        """Append and fsync one entry; call this before creating the object it describes. A journal's first
        line names the process that owns it, so `pathprof cleanup` can tell a live run's from a dead one's."""
        entry = {"kind": kind, **fields}
        self.dir.mkdir(parents=True, exist_ok=True)
        lines = [entry]
        if not self._entries and not self.path.exists():
            pid = os.getpid()
            lines.insert(0, {"kind": "owner", "pid": pid, "start_time": pid_start_time(pid)})
        with open(self.path, "a") as f:
            f.write("".join(json.dumps(e) + "\n" for e in lines))
            f.flush()
            os.fsync(f.fileno())
        self._entries.extend(lines)
        return entry

    def owner_alive(self) -> bool:
        """The process that wrote this journal is still running (same pid, same start time): a live run."""
        owner = next((e for e in self._entries if e.get("kind") == "owner"), None)
        if owner is None:
            return False                  # journals written before owners were recorded: treated as dead
        return pid_alive(owner["pid"]) and pid_start_time(owner["pid"]) == owner.get("start_time")

    def record_process(self, pid: int, argv: list[str] | None = None, netns: str | None = None, **fields) -> dict:
        return self.record("process", pid=pid, start_time=pid_start_time(pid), argv=argv or [], netns=netns,
                           **fields)

    def spawn(self, netns: str | None, argv: list[str], **kw) -> subprocess.Popen:
        """proc.spawn, journaled by the rule: the intent (argv and a mark the process carries in its
        environment, which its children inherit) before the spawn, its pid right after. A crash between the
        two leaves the intent, and the replay finds the process by its mark."""
        mark = f"{self.run_id}/{len(self._entries)}"
        self.record("process", pid=None, argv=argv, netns=netns, mark=mark)
        env = {**(kw.pop("env", None) or os.environ), MARK_ENV: mark}
        p = proc.spawn(netns, argv, env=env, **kw)
        self.record_process(p.pid, argv, netns, mark=mark)
        return p

    def teardown(self, keep=None) -> list[str]:
        """Undo every entry, newest first; returns what could not be undone (empty when clean). Entries for
        which keep(entry) is true are left alone (another live run owns an object of that name now)."""
        problems = []
        # an intent whose pid was recorded right after its spawn: that process exec'd long ago, so its mark is
        # visible in its environment (and its children's) at once; no need to look again for a late exec
        spawned = {e.get("mark") for e in self._entries if e.get("kind") == "process" and e.get("pid") is not None}
        for entry in reversed(self._entries):
            if keep is not None and keep(entry):
                continue
            try:
                if not undo(entry, spawned=entry.get("mark") in spawned):
                    problems.append(describe(entry))
            except Exception as e:  # keep going: one stuck object must not strand the rest
                problems.append(f"{describe(entry)}: {e}")
        self._entries.clear()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        return problems


def describe(entry: dict) -> str:
    k = entry["kind"]
    if k == "iptables_batch":
        from pathprof.agent.host.iptables_batch import describe as describe_batch
        return describe_batch(entry)
    if k == "iptables":
        return f"iptables -t {entry['table']} {entry['chain']} {' '.join(entry['args'])}"
    return f"{k} {entry.get('name') or entry.get('pid') or entry.get('path') or ''}".strip()


def undo(entry: dict, spawned: bool = False) -> bool:
    """Remove one journaled object. True when it is gone (including 'was never created'). spawned: for a
    process intent, its spawn is known to have returned (its pid was recorded), so no late exec is waited for."""
    k, ns = entry["kind"], entry.get("netns")
    # its namespace's name is gone, and every object inside went with it; not a process: `ip netns del`
    # removes the name only, and a process inside keeps the namespace alive
    if ns and k not in ("netns", "process") and not Path(f"/run/netns/{ns}").exists():
        return True
    if k == "process":
        if entry.get("pid") is None:      # the intent: the spawn may have happened, its pid was never recorded
            pids = marked(entry.get("mark")) if spawned else _marked_settled(entry.get("mark"))
            return all(_kill(pid, pid_start_time(pid)) for pid in pids)
        return _kill(entry["pid"], entry.get("start_time"))
    if k == "netns":
        name = entry["name"]
        if not Path(f"/run/netns/{name}").exists():
            return True
        _kill_netns_processes(name)
        return _quiet(["ip", "netns", "del", name])
    if k == "link":
        name = entry["name"]
        if not _quiet(netns_argv(ns, ["ip", "link", "show", "dev", name])):
            return True
        return _quiet(netns_argv(ns, ["ip", "link", "del", "dev", name]))
    if k in ("iptables_batch", "qdisc", "iptables", "iptables_chain", "sysctl"):
        return _undo_rule(k, entry, ns)
    if k in ("mount", "loop", "cgroup", "cgroup_subtree", "dir"):
        return _undo_storage(k, entry)
    return k in ("note", "owner")


def _undo_rule(k: str, entry: dict, ns: str | None) -> bool:
    """undo() of the netfilter rules and chains, a qdisc and a sysctl: what a path sets inside a namespace."""
    if k == "iptables_batch":
        from pathprof.agent.host.iptables_batch import remove
        return remove(entry)
    if k == "qdisc":
        from pathprof.agent.host.delayline import qdisc_undo
        return qdisc_undo(entry)
    if k == "iptables":          # journals written before batches (one entry per rule)
        cmd = entry.get("tool", "iptables")
        check = netns_argv(ns, [cmd, "-w", "-t", entry["table"], "-C", entry["chain"], *entry["args"]])
        if not _quiet(check):
            return True
        return _quiet(netns_argv(ns, [cmd, "-w", "-t", entry["table"], "-D", entry["chain"], *entry["args"]]))
    if k == "iptables_chain":
        cmd = entry.get("tool", "iptables")
        base = netns_argv(ns, [cmd, "-w", "-t", entry["table"]])
        if not _quiet(base + ["-n", "-L", entry["chain"]]):
            return True
        _quiet(base + ["-F", entry["chain"]])
        return _quiet(base + ["-X", entry["chain"]])
    if k == "sysctl":
        if entry.get("old") is None:
            return True
        return _quiet(netns_argv(ns, ["sysctl", "-q", "-w", f"{entry['name']}={entry['old']}"]))
    return False


def _undo_storage(k: str, entry: dict) -> bool:
    """undo() of the WAL device's mounts, loop devices and cgroups, and a run's own directories."""
    if k == "mount":
        from pathprof.agent.host.storage import undo_mount
        return undo_mount(entry["path"])
    if k == "loop":
        from pathprof.agent.host.storage import undo_loop
        return undo_loop(entry["path"])
    if k == "cgroup":
        from pathprof.agent.host.io_limit import undo_cgroup
        return undo_cgroup(entry["path"], entry.get("back"))
    if k == "cgroup_subtree":
        from pathprof.agent.host.io_limit import undo_subtree
        return undo_subtree(entry["path"], entry["controller"])
    if k == "dir":
        p = Path(entry["path"]).resolve()
        if not any(p.is_relative_to(r) and p != r for r in REMOVABLE_ROOTS):
            return False
        shutil.rmtree(p, ignore_errors=True)
        return not p.exists()
    return False


def marked(mark: str | None) -> list[int]:
    """Processes started by Journal.spawn with this mark (their environment carries it)."""
    if not mark:
        return []
    needle = f"{MARK_ENV}={mark}".encode() + b"\0"
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if needle in (d / "environ").read_bytes():
                    out.append(int(d.name))
            except OSError:
                continue              # gone meanwhile, or a kernel thread
    return out


def _marked_settled(mark: str | None, tries: int = 6) -> list[int]:
    """marked(), looked at again for a moment when nothing carries the mark: a process whose spawn returned a
    moment ago (an undo right after a failed record) shows no environment until its exec has set up the new image
    (Popen returns once the exec is committed, /proc/PID/environ is empty until the stack is built)."""
    pids = marked(mark)
    for _ in range(tries if mark else 0):
        if pids:
            break
        time.sleep(0.05)
        pids = marked(mark)
    return pids


def _kill(pid: int, start_time: int | None) -> bool:
    if not pid_alive(pid) or (start_time is not None and pid_start_time(pid) != start_time):
        return True  # gone, or the pid now belongs to someone else: never touch it
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 2.0)):
        for target in (lambda s: os.killpg(pid, s), lambda s: os.kill(pid, s)):
            try:
                target(sig)
                break
            except (ProcessLookupError, PermissionError):
                continue
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
            if not pid_alive(pid) or pid_start_time(pid) is None:
                return True
            time.sleep(0.05)
    return not pid_alive(pid)


def _kill_netns_processes(name: str) -> None:
    cp = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
    for tok in cp.stdout.split():
        if tok.isdigit():
            _kill(int(tok), pid_start_time(int(tok)))


def pending_journals() -> list[Path]:
    return sorted(JOURNAL_DIR.glob("*.jsonl")) if JOURNAL_DIR.exists() else []
