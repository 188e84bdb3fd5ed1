"""iptables state applied and removed in batches: one `iptables-restore --noflush` per (namespace, table).

One `iptables` call per rule costs a round trip through the whole table (iptables-nft reads the ruleset into its
cache on every call), so N rules cost O(N^2): 1,500 rules took 46 s to remove that way. A batch is one restore
input: the chains it creates (`-N`) and its rules in the spec's order (`-A`/`-I CHAIN 1`, exactly what the
one-by-one calls did), committed atomically: it is all there or none of it is.

The journal entry for a batch (kind `iptables_batch`) is written before the batch is applied and says what
removal needs: the chains the batch created (their rules go with them) and the rules it put into chains it did
not create (built-in chains, or chains that existed before). Removal is again one restore: delete those rules,
flush the batch's chains, delete them. If that fails (the batch was never applied because the run was killed
between journaling and applying, or someone changed the table), removal looks at what is really there and
removes only that.
"""
from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field

from pathprof.agent.host.netns import netns_argv
from pathprof.errors import UserError


@dataclass
class BatchRule:
    chain: str
    args: list[str]
    position: str = "append"       # "append" | "insert" (at the top, as -I CHAIN 1)
    label: str = ""                # what to call it in an error: the spec file and key


@dataclass
class Batch:
    netns: str | None
    table: str
    chains: list[str] = field(default_factory=list)
    chain_labels: list[str] = field(default_factory=list)
    rules: list[BatchRule] = field(default_factory=list)

    def foreign_rules(self) -> list[BatchRule]:
        """Rules in chains this batch does not create: they must be deleted one by one."""
        own = set(self.chains)
        return [r for r in self.rules if r.chain not in own]


def backend() -> dict:
    """The iptables programs to use, from the backend that `iptables` on this machine is (nft or legacy).
    The journal keeps the names, so a later cleanup talks to the same backend."""
    cp = subprocess.run(["iptables", "-V"], capture_output=True, text=True)
    kind = "legacy" if "legacy" in cp.stdout else "nft"
    return {"tool": f"iptables-{kind}", "restore": f"iptables-{kind}-restore", "save": f"iptables-{kind}-save"}


def quote(arg: str) -> str:
    """One argument as iptables-restore's tokenizer reads it (double quotes, backslash-escaped)."""
    if arg and not re.search(r'[\s"\'\\#]', arg):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _rule_line(op: str, r: BatchRule) -> str:
    head = f"-I {r.chain} 1" if op == "add" and r.position == "insert" else f"{'-A' if op == 'add' else '-D'} {r.chain}"
    return " ".join([head, *map(quote, r.args)])


def apply_text(b: Batch) -> tuple[str, dict[int, str]]:
    """The restore input that creates the batch, and which spec item each line came from (1-based)."""
    lines, origin = [f"*{b.table}"], {}
    for name, label in zip(b.chains, b.chain_labels or [""] * len(b.chains)):
        lines.append(f"-N {name}")
        origin[len(lines)] = label or f"chain {name}"
    for r in b.rules:
        lines.append(_rule_line("add", r))
        origin[len(lines)] = r.label or f"rule {lines[-1]}"
    lines.append("COMMIT")
    return "\n".join(lines) + "\n", origin


def remove_text(table: str, chains: list[str], foreign: list[BatchRule]) -> str:
    lines = [f"*{table}"]
    lines += [_rule_line("delete", r) for r in reversed(foreign)]
    lines += [f"-F {c}" for c in chains]          # flush all first: one chain may jump to another
    lines += [f"-X {c}" for c in chains]
    return "\n".join(lines + ["COMMIT"]) + "\n"


def _restore(netns: str | None, tools: dict, text: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(netns_argv(netns, [tools["restore"], "-w", "--noflush"]), input=text, text=True,
                          capture_output=True, timeout=timeout)


def _failed_line(stderr: str) -> int | None:
    m = re.search(r"line:? (\d+)", stderr)
    return int(m.group(1)) if m else None


def _message(stderr: str) -> str:
    """iptables-restore's complaint without its usage hint and line-number boilerplate."""
    keep = []
    for ln in stderr.strip().splitlines():
        ln = ln.strip()
        if not ln or ln.startswith("Try `") or ln.startswith("Error occurred at line"):
            continue
        ln = re.sub(r"^iptables(-\w+)*-restore( v[\d.]+ \([\w_]+\))?: ", "", ln)
        ln = re.sub(r"^line \d+ failed: ?", "", ln)
        keep.append(ln)
    return " ".join(keep) or stderr.strip()


def apply(b: Batch, tools: dict, where: str) -> None:
    """Create the batch (journal it first!); a refusal names the spec item and quotes iptables."""
    text, origin = apply_text(b)
    cp = _restore(b.netns, tools, text)
    if cp.returncode == 0:
        return
    msg = _message(cp.stderr)
    line = _failed_line(cp.stderr)
    lines = text.splitlines()
    culprit = origin.get(line) if line else None
    if culprit is None:   # refused at COMMIT (e.g. a jump to a chain that does not exist): find the rule by name
        m = re.search(r"[Cc]hain '([^']+)'", msg)
        for n, item in origin.items():
            if m and re.search(rf"(^| )-[jg] {re.escape(m.group(1))}( |$)", lines[n - 1]):
                culprit, line = item, n
                break
    what = f"{culprit}: iptables refused `{lines[line - 1]}`" if culprit else \
        f"iptables refused the {b.table} table's rules"
    raise UserError(f"{what} in {where}: {msg} (nothing of this table was applied)")


def remove(entry: dict) -> bool:
    """Undo one journaled batch; True when nothing of it is left."""
    tools = {k: entry[k] for k in ("tool", "restore", "save")}
    ns, table, chains = entry.get("netns"), entry["table"], list(entry.get("chains", []))
    foreign = [BatchRule(r["chain"], r["args"]) for r in entry.get("rules", [])]
    if _restore(ns, tools, remove_text(table, chains, foreign)).returncode == 0:
        return True
    # Slow path, only when the fast one failed: remove what is really there.
    saved = subprocess.run(netns_argv(ns, [tools["save"], "-t", table]), capture_output=True, text=True).stdout
    present = set(re.findall(r"^:(\S+)", saved, re.M))
    chains = [c for c in chains if c in present]
    check = [tools["tool"], "-w", "-t", table, "-C"]
    foreign = [r for r in foreign
               if subprocess.run(netns_argv(ns, [*check, r.chain, *r.args]), capture_output=True).returncode == 0]
    if not chains and not foreign:
        return True
    return _restore(ns, tools, remove_text(table, chains, foreign)).returncode == 0


def journal_fields(b: Batch, tools: dict) -> dict:
    return {"netns": b.netns, "table": b.table, **tools, "chains": list(b.chains),
            "rules": [{"chain": r.chain, "args": r.args} for r in b.foreign_rules()], "rule_count": len(b.rules)}


def describe(entry: dict) -> str:
    where = entry.get("netns") or "the root namespace"
    return (f"iptables {entry['table']} table in {where}: {len(entry.get('chains', []))} chains, "
            f"{entry.get('rule_count', len(entry.get('rules', [])))} rules")
