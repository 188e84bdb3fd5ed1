"""iptables rules at scale: a user's spec with thousands of rules is applied in batches (one iptables-restore per
namespace and table), in the spec's exact order, journaled first, and removed again to the last rule, also by
replaying the journal of a killed run. A bad rule is refused naming the file, the rule and iptables' message,
with nothing left behind. Correctness only: the timings are bench/rules_scale's business."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import run_pathprof
from pathprof.agent.host.journal import JOURNAL_DIR, Journal
from pathprof.topologies import builder, spec

pytestmark = pytest.mark.integration

NS = ("pp-rs-a", "pp-rs-b")


def _head(ns_a: str, ns_b: str) -> list[str]:
    return ['name = "rules-scale"', 'description = "many rules"',
            f'[[hosts]]\nname = "a"\nnetns = "{ns_a}"', f'[[hosts]]\nname = "b"\nnetns = "{ns_b}"',
            '[postgres]\nhost = "b"\nlisten = "127.0.0.1"',
            '[client]\nhost = "b"\n[client.targets.lo]\naddress = "127.0.0.1"']


def _rule(host, table, chain, args, position="append") -> str:
    pos = '\nposition = "insert"' if position == "insert" else ""
    return (f'[[rules]]\nhost = "{host}"\ntable = "{table}"\nchain = "{chain}"\nargs = {json.dumps(args)}{pos}')


def big_spec(per_host: int, ns=NS) -> tuple[str, dict]:
    """A spec with about per_host rules in each host, in filter and nat, built-in and own chains, appends and
    inserts mixed; and the order each chain must end up in (simulating -A / -I CHAIN 1 one by one)."""
    parts, expect = _head(*ns), {}
    for host in ("a", "b"):
        order: dict[tuple, list[str]] = {}

        def add(table, chain, args, position="append"):
            parts.append(_rule(host, table, chain, args, position))
            lst = order.setdefault((table, chain), [])
            line = " ".join(args)
            lst.insert(0, line) if position == "insert" else lst.append(line)
        for i in range(10):
            parts.append(f'[[chains]]\nhost = "{host}"\ntable = "filter"\nname = "PP-R{i}"')
        for i in range(4):
            parts.append(f'[[chains]]\nhost = "{host}"\ntable = "nat"\nname = "PP-NAT{i}"')
        for i in range(10):
            add("filter", "FORWARD", ["-j", f"PP-R{i}"])
            add("filter", "FORWARD", ["-s", f"198.18.9.{i}/32", "-j", "ACCEPT"], "insert")
        for i in range(4):
            add("nat", "PREROUTING", ["-j", f"PP-NAT{i}"])
        n = 0
        while sum(len(v) for v in order.values()) < per_host:
            n += 1
            a, b = divmod(n, 250)
            if n % 3:
                add("filter", f"PP-R{n % 10}", ["-s", f"198.18.{a}.{b}/32", "-p", "tcp", "-m", "tcp", "--dport",
                                                  str(1000 + n), "-j", "ACCEPT"], "insert" if n % 7 == 0 else "append")
            else:
                add("nat", f"PP-NAT{n % 4}", ["-d", f"198.18.{a}.{b}/32", "-p", "tcp", "-m", "tcp", "--dport", "80",
                                                "-j", "DNAT", "--to-destination", "198.18.1.2:5432"])
        expect[ns[0] if host == "a" else ns[1]] = order
    return "\n\n".join(parts) + "\n", expect


def saved(ns: str) -> dict[tuple, list[str]]:
    """Every rule in the namespace, by (table, chain), in iptables-save's (= evaluation) order."""
    out = subprocess.run(["ip", "netns", "exec", ns, "iptables-save"], capture_output=True, text=True, check=True)
    found, table = {}, None
    for line in out.stdout.splitlines():
        if line.startswith("*"):
            table = line[1:]
        elif line.startswith("-A "):
            _, chain, rest = line.split(" ", 2)
            found.setdefault((table, chain), []).append(rest)
    return found


def chains(ns: str) -> list[str]:
    out = subprocess.run(["ip", "netns", "exec", ns, "iptables-save"], capture_output=True, text=True).stdout
    return re.findall(r"^:(PP-\S+)", out, re.M)


@pytest.fixture
def own_namespaces():
    """Two namespaces of this test's own (not journaled), so removal is seen while the namespaces still exist."""
    for ns in NS:
        assert not Path(f"/run/netns/{ns}").exists(), f"{ns} exists: another run of this test is going on"
        subprocess.run(["ip", "netns", "add", ns], check=True)
    yield NS
    for ns in NS:
        subprocess.run(["ip", "netns", "del", ns])


def test_thousands_of_rules_in_spec_order_then_removed_to_the_last(own_namespaces, tmp_path):
    text, expect = big_spec(1500)
    topo = spec.parse(text, str(tmp_path / "big.toml"))
    journal = Journal("test-rules-scale", tmp_path)
    builder.apply_iptables(topo, journal)
    # one journal entry per (namespace, table), written before the batch was applied
    assert sorted((e["netns"], e["table"]) for e in journal.entries if e["kind"] == "iptables_batch") == sorted(
        (ns, t) for ns in NS for t in ("filter", "nat"))
    for ns in NS:
        got = saved(ns)
        assert sum(len(v) for v in got.values()) == sum(len(v) for v in expect[ns].values()) >= 1500
        assert got == expect[ns], f"{ns}: rule order differs from the spec"
    assert journal.teardown() == []
    for ns in NS:
        assert saved(ns) == {} and chains(ns) == [], f"{ns}: rules or chains left after teardown"


def test_journal_of_a_killed_build_is_replayed(own_namespaces, tmp_path):
    """SIGKILL right after the rules went in: replaying the journal (what `pathprof cleanup` does) removes them;
    a batch journaled but never applied replays cleanly too."""
    text, _ = big_spec(800)
    (tmp_path / "big.toml").write_text(text)
    script = textwrap.dedent(f"""
        import os, signal
        from pathprof.agent.host.journal import Journal
        from pathprof.topologies import builder, spec
        topo = spec.load({str(tmp_path / "big.toml")!r})
        builder.apply_iptables(topo, Journal("killed", __import__("pathlib").Path({str(tmp_path)!r})))
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    cp = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert cp.returncode == -signal.SIGKILL, cp.stderr
    assert all(saved(ns) for ns in NS), "the killed build applied nothing"
    assert Journal.load(tmp_path / "killed.jsonl").teardown() == []
    assert all(saved(ns) == {} and chains(ns) == [] for ns in NS)
    # journaled, then killed before iptables-restore ran: nothing to remove, and replay says so without problems
    j = Journal("never-applied", tmp_path)
    j.record("iptables_batch", netns=NS[0], table="nat", tool="iptables-nft", restore="iptables-nft-restore",
             save="iptables-nft-save", chains=["PP-NAT0"], rules=[{"chain": "PREROUTING", "args": ["-j", "PP-NAT0"]}],
             rule_count=5)
    assert Journal.load(j.path).teardown() == []


def test_a_bad_rule_names_file_rule_and_iptables_message_and_leaves_nothing(tmp_path):
    text, _ = big_spec(600, ns=("pp-rs-c", "pp-rs-d"))
    bad = _rule("b", "filter", "FORWARD", ["-p", "tcp", "--dport", "99999", "-j", "ACCEPT"])
    text += "\n" + bad + "\n" + _rule("b", "filter", "FORWARD", ["-j", "ACCEPT"]) + "\n"
    path = tmp_path / "bad-rules.toml"
    path.write_text(text)
    index = len(re.findall(r"^\[\[rules\]\]", text, re.M)) - 2
    cp = run_pathprof("topology", "up", str(path), timeout=120)
    assert cp.returncode != 0
    lines = [x for x in cp.stderr.splitlines() if x.startswith("pathprof: error:")]
    assert len(lines) == 1 and "Traceback" not in cp.stderr, cp.stderr[-2000:]
    assert str(path) in lines[0] and f"rules[{index}]" in lines[0] and "99999" in lines[0], lines[0]
    assert "invalid port" in lines[0], lines[0]           # iptables' own words
    for ns in ("pp-rs-c", "pp-rs-d"):
        assert not Path(f"/run/netns/{ns}").exists(), f"{ns} left behind"
    assert not (JOURNAL_DIR / "topology-rules-scale.jsonl").exists()


def test_unknown_jump_target_is_pinned_to_its_rule(own_namespaces, tmp_path):
    """iptables-nft refuses a jump to a missing chain only at COMMIT; the error still names the rule."""
    text = "\n\n".join(_head(*NS) + [_rule("a", "filter", "FORWARD", ["-j", "ACCEPT"]),
                                     _rule("a", "filter", "FORWARD", ["-j", "PP-NOWHERE"])]) + "\n"
    topo = spec.parse(text, "jump.toml")
    journal = Journal("test-rules-jump", tmp_path)
    with pytest.raises(Exception) as err:
        builder.apply_iptables(topo, journal)
    assert "jump.toml: rules[1]" in str(err.value) and "PP-NOWHERE" in str(err.value), str(err.value)
    assert saved(NS[0]) == {}
    assert journal.teardown() == []
    assert os.path.exists(f"/run/netns/{NS[0]}")
