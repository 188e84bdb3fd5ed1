"""compare entries that vary a run: TOPOLOGY[:KEY=VALUE]... parsed, applied and refused like run's own flags."""
import pytest
from fixtures_summaries import bridge, dnat
from pathprof.agent.cli import args as cli_args
from pathprof.agent.cli.variants import apply, parse_variant
from pathprof.analysis.explain import explain
from pathprof.analysis.repeats import cause_spread
from pathprof.errors import UserError


def compare_args(*extra):
    return cli_args.build_parser().parse_args(["compare", "a", "b", "--clients", "4", "--pg-set", "work_mem=8MB",
                                               *extra])


def test_entry_settings_land_on_top_of_the_command_options():
    a = compare_args()
    ns, own = apply(a, parse_variant("docker-dnat:userland-proxy=off"))
    assert (ns.clients, ns.pg_set, own) == (4, ["work_mem=8MB"], {"userland_proxy": "off"})
    ns, own = apply(a, parse_variant("loopback:pg-set=fsync=off:clients=96"))
    assert (ns.clients, ns.pg_set, own) == (96, ["work_mem=8MB", "fsync=off"], {})
    ns, own = apply(a, parse_variant("pgbouncer:option=pool_mode=transaction:mode=simple"))
    assert (ns.mode, own) == ("simple", {"pool_mode": "transaction"})
    assert apply(a, parse_variant("unix:connect=on"))[0].connect is True
    assert a.clients == 4 and a.pg_set == ["work_mem=8MB"] and a.connect is False      # the command's stay


def test_entry_as_written_is_the_label():
    v = parse_variant("unix:clients=16")
    assert (v.topology, v.label, v.settings) == ("unix", "unix:clients=16", [("clients", "16")])
    assert parse_variant("loopback").settings == []


@pytest.mark.parametrize("text,needle", [
    ("unix:bogus=1", "unknown setting 'bogus'"),
    ("unix:clients=0", "at least 1"),
    ("unix:clients", "is not KEY=VALUE"),
    ("unix:connect=maybe", "takes on or off"),
    ("unix:mode=bogus", "invalid choice"),
    (":clients=4", "no topology"),
])
def test_bad_entries_are_refused_with_the_entry_named(text, needle):
    with pytest.raises(UserError) as e:
        apply(compare_args(), parse_variant(text))
    assert needle in str(e.value) and (text in str(e.value) or text.startswith(":"))


def test_cause_spread_marks_a_cause_whose_repeats_straddle_zero():
    b, d = bridge(), dnat()
    e = explain(b, d)
    noisy = explain(b, d)
    for c in noisy["causes"]:
        c["delta_us_per_txn"] = -c["delta_us_per_txn"]       # one repeat saw the opposite move
    cause_spread(e, [explain(b, d), noisy])
    hop = e["causes"][0]
    assert hop["spread"] == {"min": -45.0, "max": 45.0, "n": 2} and hop["uncertain"] is True
    cause_spread(e, [explain(b, d), explain(b, d)])
    assert e["causes"][0]["uncertain"] is False
