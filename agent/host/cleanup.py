"""`pathprof cleanup`: replay journals left by killed runs, then sweep pp- objects as a last resort.

Safe on a machine where other runs are going on: a journal whose owner process is still alive belongs to a live
run, and neither its journal nor any object named in it is touched — not by replaying a dead run's journal that
names the same object (a new run of the same path), not by the sweep. A `pathprof topology up` journal is a path
left up on purpose (`pathprof topology down` removes it) and is kept the same way. Objects are listed before the
journals are read: a journal is written before its object is created, so every object the sweep sees is already
in the journal that protects it.
"""
from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

from pathprof.agent.host.journal import Journal, describe, pending_journals
from pathprof.agent.host.proc import pid_alive, pid_start_time

HELD_PREFIX = "topology-"   # run ids of `pathprof topology up`
LEGACY_FRESH_S = 600.0       # an owner-less journal without processes this young may still be building


def _out(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True).stdout


def leftover_namespaces() -> list[str]:
    return [line.split()[0] for line in _out(["ip", "netns", "list"]).splitlines()
            if line.split() and line.split()[0].startswith("pp-")]


def leftover_links() -> list[str]:
    names = re.findall(r"^\d+: ([^:@]+)[:@]", _out(["ip", "-o", "link", "show"]), re.M)
    return [n for n in names if n.startswith("pp-")]


def leftover_chains() -> list[tuple[str, str]]:
    """(table, chain) of PP- chains in the root namespace's iptables."""
    found, table = [], None
    for line in _out(["iptables-save"]).splitlines():
        if line.startswith("*"):
            table = line[1:]
        elif line.startswith(":PP-") or line.startswith(":pp-"):
            found.append((table, line[1:].split()[0]))
    return found


def leftover_rules() -> list[tuple[str, list[str]]]:
    """Root-namespace rules that jump to a PP- chain (must go before the chain can be deleted)."""
    rules, table = [], None
    for line in _out(["iptables-save"]).splitlines():
        if line.startswith("*"):
            table = line[1:]
        elif line.startswith("-A ") and re.search(r"-j (PP-|pp-)", line) and not re.match(r"-A (PP-|pp-)", line):
            rules.append((table, line.split()[1:]))
    return rules


def names_in(entry) -> set[str]:
    """Every pp-/PP- name an entry mentions, in any field or list (namespaces, links, chains; new entry
    kinds included without knowing their layout)."""
    if isinstance(entry, dict):
        return set().union(*(names_in(v) for v in entry.values())) if entry else set()
    if isinstance(entry, (list, tuple)):
        return set().union(*(names_in(v) for v in entry)) if entry else set()
    if isinstance(entry, str) and entry[:3].lower() == "pp-":
        return {entry}
    if isinstance(entry, str) and "/pp-" in entry:      # a path to a pp- object (a cgroup): its last part
        last = entry.rstrip("/").rsplit("/", 1)[-1]
        return {last} if last[:3].lower() == "pp-" else set()
    return set()


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _live_owner(path: Path, j: Journal) -> int | None:
    """pid of the live run that owns journal j, else None. Journals written before owners were recorded (an
    older pathprof) are judged by their processes: a run's servers are children of its pathprof process while
    it lives and are re-parented to init when it dies; one with no process yet is live while it is fresh."""
    owner = next((e for e in j.entries if e["kind"] == "owner"), None)
    if owner is not None:
        return owner["pid"] if j.owner_alive() else None
    procs = [e for e in j.entries if e["kind"] == "process" and e.get("pid")]   # not a spawn's intent
    for e in procs:
        if pid_alive(e["pid"]) and pid_start_time(e["pid"]) == e.get("start_time"):
            parent = _parent(e["pid"])
            if parent and parent > 1:
                return parent
    if not procs and time.time() - path.stat().st_mtime < LEGACY_FRESH_S:
        return -1
    return None


def live_journals() -> list[tuple[Path, Journal, str]]:
    """Journals that must be left alone, with why: a live run's, or a path brought up by `topology up`."""
    out = []
    for path in pending_journals():
        try:
            j = Journal.load(path)
            pid = _live_owner(path, j)
        except FileNotFoundError:         # its run finished meanwhile
            continue
        if pid:
            out.append((path, j, f"run {path.stem} is live (pathprof pid {pid})" if pid > 0 else
                        f"run {path.stem} is being set up"))
        elif path.stem.startswith(HELD_PREFIX):
            out.append((path, j, f"topology {path.stem[len(HELD_PREFIX):]} is up "
                                 f"(pathprof topology down {path.stem[len(HELD_PREFIX):]})"))
    return out


def protected_names() -> set[str]:
    return set().union(*(names_in(j.entries) for _, j, _ in live_journals())) if pending_journals() else set()


def _mark_killed(j: Journal) -> None:
    """The run directory of a run that was killed before it finished says so (status `killed`)."""
    from pathprof.analysis.rundir import RunDir
    for e in j.entries:
        if e["kind"] == "note" and e.get("run_dir"):
            try:
                rd = RunDir.open(e["run_dir"])
                if rd.meta.get("status") in ("running", None):
                    rd.update(status="killed", failure=list(rd.meta.get("failure") or []) + [
                        f"pathprof was killed before the run finished; `pathprof cleanup` removed what it left "
                        f"({time.strftime('%Y-%m-%d %H:%M:%S')})"])
            except Exception:             # gone, unreadable, or on a full disk: the cleanup itself matters more
                pass


def cleanup_all(dry_run: bool = False) -> dict:
    """Replay the journals of dead runs, then sweep the pp- objects no journal accounts for; what live runs own
    is left alone. Returns {actions, problems, kept, dry_run}."""
    actions, problems, kept = [], [], []
    _replay_dead_journals(dry_run, actions, problems, kept)
    _sweep_leftovers(dry_run, actions, problems)      # the sweep: list first, then read the journals (see above)
    return {"actions": actions, "problems": problems, "kept": kept, "dry_run": dry_run}


def _replay_dead_journals(dry_run: bool, actions: list, problems: list, kept: list) -> None:
    live = live_journals()
    live_paths = {p for p, _, _ in live}
    kept += [f"left alone: {why}" for _, _, why in live]
    guarded = set().union(*(names_in(j.entries) for _, j, _ in live)) if live else set()
    live_sysctls = {(e["name"], e.get("netns")) for _, j, _ in live for e in j.entries if e["kind"] == "sysctl"}

    def owned_by_live_run(entry: dict) -> bool:
        if entry["kind"] == "sysctl" and (entry["name"], entry.get("netns")) in live_sysctls:
            return True                   # restoring it would undo what the live run set
        return entry["kind"] not in ("process", "dir", "owner") and bool(names_in(entry) & guarded)

    for path in pending_journals():
        if path in live_paths:
            continue
        try:
            j = Journal.load(path)
            if _live_owner(path, j):        # started after the list above was made
                continue
        except FileNotFoundError:
            continue
        if not dry_run:
            _mark_killed(j)
        for e in reversed(j.entries):
            if e["kind"] == "owner":
                continue
            if owned_by_live_run(e):
                kept.append(f"journal {path.stem}: left {describe(e)} (a live run owns that name now)")
            else:
                actions.append(f"journal {path.stem}: remove {describe(e)}")
        if not dry_run:
            problems += j.teardown(keep=owned_by_live_run)


def _sweep_leftovers(dry_run: bool, actions: list, problems: list) -> None:
    """pp- namespaces, links, iptables rules and chains, and cgroups that no live journal names."""
    namespaces, links = leftover_namespaces(), leftover_links()
    rules, chains = leftover_rules(), leftover_chains()
    from pathprof.agent.host.io_limit import leftover_cgroups, undo_cgroup
    cgroups = leftover_cgroups()
    guarded = protected_names()

    def remove(what: str, argv: list[str] | None, problem: str | None = None, still_there=None) -> None:
        actions.append(f"remove {what}")
        if dry_run or argv is None:
            return
        if subprocess.run(argv, capture_output=True).returncode != 0 and problem:
            if still_there is None or still_there():
                problems.append(problem)

    for ns in namespaces:
        if ns not in guarded:
            remove(f"namespace {ns}", ["ip", "netns", "del", ns], f"namespace {ns}")
    for link in links:
        if link not in guarded:
            remove(f"link {link}", ["ip", "link", "del", link], f"link {link}",
                   still_there=lambda link=link: link in leftover_links())
    for table, args in rules:
        if not names_in(args) & guarded:
            remove(f"iptables -t {table} {' '.join(args)}", ["iptables", "-w", "-t", table, "-D", *args])
    for table, chain in chains:
        if chain not in guarded:
            if not dry_run:
                subprocess.run(["iptables", "-w", "-t", table, "-F", chain], capture_output=True)
            remove(f"iptables chain {table}/{chain}", ["iptables", "-w", "-t", table, "-X", chain],
                   f"iptables chain {table}/{chain}")
    for cg in cgroups:
        if cg.name not in guarded:
            actions.append(f"remove cgroup {cg}")
            if not dry_run and not undo_cgroup(str(cg), None):
                problems.append(f"cgroup {cg}")
