"""`pathprof cleanup`: replay journals left by killed runs, then sweep pp- objects as a last resort."""
from __future__ import annotations

import re
import subprocess

from .journal import Journal, describe, pending_journals


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


def cleanup_all(dry_run: bool = False) -> dict:
    actions, problems = [], []
    for path in pending_journals():
        j = Journal.load(path)
        for e in reversed(j.entries):
            actions.append(f"journal {path.stem}: remove {describe(e)}")
        if not dry_run:
            problems += j.teardown()
    for ns in leftover_namespaces():
        actions.append(f"remove namespace {ns}")
        if not dry_run and subprocess.run(["ip", "netns", "del", ns]).returncode != 0:
            problems.append(f"namespace {ns}")
    for link in leftover_links():
        actions.append(f"remove link {link}")
        if not dry_run and subprocess.run(["ip", "link", "del", link], capture_output=True).returncode != 0:
            if link in leftover_links():
                problems.append(f"link {link}")
    for table, args in leftover_rules():
        actions.append(f"remove iptables -t {table} {' '.join(args)}")
        if not dry_run:
            subprocess.run(["iptables", "-w", "-t", table, "-D", *args], capture_output=True)
    for table, chain in leftover_chains():
        actions.append(f"remove iptables chain {table}/{chain}")
        if not dry_run:
            subprocess.run(["iptables", "-w", "-t", table, "-F", chain], capture_output=True)
            if subprocess.run(["iptables", "-w", "-t", table, "-X", chain], capture_output=True).returncode:
                problems.append(f"iptables chain {table}/{chain}")
    from .io_limit import leftover_cgroups, undo_cgroup
    for cg in leftover_cgroups():
        actions.append(f"remove cgroup {cg}")
        if not dry_run and not undo_cgroup(str(cg), None):
            problems.append(f"cgroup {cg}")
    return {"actions": actions, "problems": problems, "dry_run": dry_run}
