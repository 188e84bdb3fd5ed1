"""iptables-restore batches as text: spec order kept, removal deletes foreign rules before flushing and deleting
chains, arguments quoted the way iptables-restore tokenizes them, spec keys kept for error messages."""
from pathprof.agent.host import iptables_batch as ib
from pathprof.topologies import builder, spec

SPEC = """
name = "t"
[[hosts]]
name = "a"
netns = "pp-ut-a"
[[chains]]
host = "a"
table = "nat"
name = "PP-X"
[[rules]]
host = "a"
table = "nat"
chain = "PREROUTING"
args = ["-j", "PP-X"]
[[rules]]
host = "a"
chain = "FORWARD"
args = ["-m", "comment", "--comment", "two words \\"quoted\\"", "-j", "ACCEPT"]
[[rules]]
host = "a"
table = "nat"
chain = "PP-X"
args = ["-p", "tcp", "-j", "RETURN"]
[[rules]]
host = "a"
table = "nat"
chain = "PREROUTING"
args = ["-s", "198.18.0.1/32", "-j", "ACCEPT"]
position = "insert"
[postgres]
host = "a"
[client]
host = "a"
[client.targets.lo]
address = "127.0.0.1"
"""


def test_one_batch_per_namespace_and_table_in_spec_order():
    topo = spec.parse(SPEC, "t.toml")
    batches = {b.table: b for b in builder.iptables_batches(topo)}
    assert set(batches) == {"nat", "filter"}
    text, origin = ib.apply_text(batches["nat"])
    assert text.splitlines() == ["*nat", "-N PP-X", "-A PREROUTING -j PP-X", "-A PP-X -p tcp -j RETURN",
                                 "-I PREROUTING 1 -s 198.18.0.1/32 -j ACCEPT", "COMMIT"]
    assert origin[3] == "t.toml: rules[0]" and origin[5] == "t.toml: rules[3]" and origin[2] == "t.toml: chains[0]"
    f_text, _ = ib.apply_text(batches["filter"])
    assert '--comment "two words \\"quoted\\""' in f_text


def test_removal_deletes_foreign_rules_newest_first_then_flushes_and_deletes_chains():
    topo = spec.parse(SPEC, "t.toml")
    nat = next(b for b in builder.iptables_batches(topo) if b.table == "nat")
    entry = ib.journal_fields(nat, {"tool": "iptables-nft", "restore": "r", "save": "s"})
    assert [r["args"] for r in entry["rules"]] == [["-j", "PP-X"], ["-s", "198.18.0.1/32", "-j", "ACCEPT"]]
    assert entry["rule_count"] == 3      # the rule inside PP-X goes with its chain
    text = ib.remove_text("nat", entry["chains"], [ib.BatchRule(r["chain"], r["args"]) for r in entry["rules"]])
    assert text.splitlines() == ["*nat", "-D PREROUTING -s 198.18.0.1/32 -j ACCEPT", "-D PREROUTING -j PP-X",
                                 "-F PP-X", "-X PP-X", "COMMIT"]


def test_iptables_messages_lose_their_boilerplate():
    err = ('iptables-restore v1.8.9 (nf_tables): unknown option "--frob"\nError occurred at line: 4\n'
           "Try `iptables-restore -h' or 'iptables-restore --help' for more information.\n")
    assert ib._message(err) == 'unknown option "--frob"' and ib._failed_line(err) == 4
    err2 = "iptables-restore: line 2 failed: Chain already exists.\n"
    assert ib._message(err2) == "Chain already exists." and ib._failed_line(err2) == 2


def test_a_bad_table_is_refused_at_parse_time():
    import pytest
    from pathprof.errors import UserError
    with pytest.raises(UserError, match=r"t.toml: rules\[0\].table: 'nta' is not one of"):
        spec.parse(SPEC.replace('table = "nat"\nchain = "PREROUTING"\nargs = ["-j"', 'table = "nta"\nchain = '
                                '"PREROUTING"\nargs = ["-j"', 1), "t.toml")
