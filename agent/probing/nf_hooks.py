"""Which IPv4 netfilter hooks of a network namespace have functions registered on them.

A hook with nothing registered costs a packet nothing, and bracketing it costs two BPF runs and two clock
reads per packet; so pathprof brackets only the hooks where something can run: the base chains of the
nftables ruleset (iptables-nft programs those), the tables of iptables-legacy, and conntrack (with its
defragmentation) wherever NAT or a conntrack match makes the namespace use it. The kernel's own listing
(`nft list hooks`, nfnetlink_hook) is asked first; kernels built without it answer nothing, and the rules
are read instead. When neither can be read, every hook is bracketed, and the reason is kept for the report.
"""
from __future__ import annotations

import json
import shutil
import subprocess

from pathprof.agent.host.netns import netns_argv

HOOKS = ("prerouting", "input", "forward", "output", "postrouting")
# built-in chains of iptables-legacy's tables -> the hook each is registered on
_LEGACY_TABLE_HOOKS = {"raw": ("prerouting", "output"), "mangle": HOOKS, "nat": ("prerouting", "input", "output",
                                                                                 "postrouting"),
                       "filter": ("input", "forward", "output"), "security": ("input", "forward", "output")}
_CONNTRACK_HOOKS = ("prerouting", "input", "output", "postrouting")


def _run(netns: str | None, argv: list[str]) -> str | None:
    full = netns_argv(netns, argv)
    try:
        cp = subprocess.run(full, capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.SubprocessError):
        return None
    return cp.stdout if cp.returncode == 0 else None


def _from_kernel_listing(netns: str | None) -> set[str] | None:
    """`nft list hooks ip`: None when the kernel/nft cannot list hooks (empty output is not an answer: even
    an unused namespace would list nothing, indistinguishable from a kernel without nfnetlink_hook)."""
    text = _run(netns, ["nft", "list", "hooks", "ip"])
    if not text or "hook" not in text:
        return None
    found = set()
    for line in text.splitlines():
        words = line.replace("{", " ").split()
        if len(words) >= 2 and words[0] == "hook" and words[1] in HOOKS:
            found.add(words[1])
    return found


def _uses_conntrack(expr) -> bool:
    if isinstance(expr, dict):
        return "ct" in expr or any(_uses_conntrack(v) for v in expr.values())
    if isinstance(expr, list):
        return any(_uses_conntrack(v) for v in expr)
    return False


def hooks_from_ruleset(text: str) -> set[str] | None:
    """Hooks used by an `nft -j list ruleset` document (None if it is not one): the IPv4 base chains' hooks,
    and conntrack's when a NAT chain or a conntrack match makes the namespace use it."""
    try:
        items = json.loads(text).get("nftables", [])
    except (ValueError, AttributeError):
        return None
    found, conntrack = set(), False
    for item in items:
        chain, rule = item.get("chain"), item.get("rule")
        if chain and chain.get("family") in ("ip", "inet") and chain.get("hook") in HOOKS:
            found.add(chain["hook"])
            conntrack |= chain.get("type") == "nat"
        if rule and rule.get("family") in ("ip", "inet"):
            conntrack |= _uses_conntrack(rule.get("expr"))
    if conntrack:
        found.update(_CONNTRACK_HOOKS)
    return found


def _from_nft_ruleset(netns: str | None) -> set[str] | None:
    text = _run(netns, ["nft", "-j", "list", "ruleset"])
    return None if text is None else hooks_from_ruleset(text)


def _from_legacy(netns: str | None) -> set[str]:
    if not shutil.which("iptables-legacy-save"):
        return set()
    text = _run(netns, ["iptables-legacy-save"]) or ""
    found = set()
    for line in text.splitlines():
        if line.startswith("*"):
            table = line[1:].strip()
            found.update(_LEGACY_TABLE_HOOKS.get(table, ()))
            if table == "nat":
                found.update(_CONNTRACK_HOOKS)
        elif " -m conntrack" in line or " -m state" in line:
            found.update(_CONNTRACK_HOOKS)
    return found


def active_hooks(netns: str | None) -> tuple[list[str], str]:
    """(hooks worth bracketing in this namespace, in hook order; how that was found)."""
    hooks = _from_kernel_listing(netns)
    how = "kernel hook listing"
    if hooks is None:
        hooks = _from_nft_ruleset(netns)
        how = "ruleset"
        if hooks is None:
            return list(HOOKS), "ruleset unreadable (nft missing or failed): every hook bracketed"
        hooks |= _from_legacy(netns)
    return [h for h in HOOKS if h in hooks], how
