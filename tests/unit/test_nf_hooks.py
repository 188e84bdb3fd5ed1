"""Which netfilter hooks get brackets: only those with something registered (pathprof.agent.probing.nf_hooks)."""
import json

from pathprof.agent.probing.nf_hooks import hooks_from_ruleset


def doc(*items):
    return json.dumps({"nftables": [{"metainfo": {"version": "1.0.6"}}, *items]})


def chain(family, hook, type_="filter", name="X"):
    return {"chain": {"family": family, "table": "t", "name": name, "type": type_, "hook": hook, "prio": 0}}


def test_empty_ruleset_brackets_nothing():
    assert hooks_from_ruleset(doc()) == set()


def test_filter_chain_brackets_its_hook_only():
    assert hooks_from_ruleset(doc(chain("ip", "input"))) == {"input"}


def test_nat_brings_conntrack_hooks():
    # conntrack runs on prerouting/output (in) and input/postrouting (confirm) once NAT is used
    assert hooks_from_ruleset(doc(chain("ip", "postrouting", "nat"))) == {"prerouting", "input", "output",
                                                                           "postrouting"}


def test_conntrack_match_in_a_rule_brings_conntrack_hooks():
    rule = {"rule": {"family": "inet", "table": "t", "chain": "X",
                     "expr": [{"match": {"op": "in", "left": {"ct": {"key": "state"}}, "right": "established"}}]}}
    assert hooks_from_ruleset(doc(chain("inet", "forward"), rule)) == {"prerouting", "input", "forward", "output",
                                                                        "postrouting"}


def test_other_families_and_user_chains_do_not_count():
    user_chain = {"chain": {"family": "ip", "table": "t", "name": "PP-USER"}}     # no hook: jumped to only
    assert hooks_from_ruleset(doc(chain("ip6", "input"), chain("arp", "input"), user_chain)) == set()


def test_not_a_ruleset_is_none():
    assert hooks_from_ruleset("garbage") is None
