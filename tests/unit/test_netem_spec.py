"""Link impairments in specs and on the command line (topologies.impairments), their compare entries, and their stages
in the latency view. The real delay line is exercised by tests/integration/test_netem.py."""
import pandas as pd
import pytest
from pathprof.agent.cli import args as cli_args
from pathprof.agent.cli.variants import apply, parse_variant
from pathprof.agent.host import delayline
from pathprof.analysis import stages as views
from pathprof.errors import UserError
from pathprof.topologies import impairments as netem
from pathprof.topologies import spec

SPEC = """
name = "two"
[options]
rtt_us = "300"
[[hosts]]
name = "c"
netns = "pp-t-c"
[[hosts]]
name = "s"
netns = "pp-t-s"
[[bridges]]
name = "pp-t-br"
host = "s"
[[links]]
name = "wire"
a = { host = "c", ifname = "pp-t-c0", address = "198.18.30.1/24" }
b = { host = "s", ifname = "pp-t-s0", address = "198.18.30.2/24" }
%s
[[links]]
name = "bridged"
a = { bridge = "pp-t-br", ifname = "pp-t-b0" }
b = { host = "s", ifname = "pp-t-b1" }
[postgres]
host = "s"
listen = "198.18.30.2"
[client]
host = "c"
[client.targets.t]
address = "198.18.30.2"
"""


def parse(netem_lines: str = "", links=None, options=None):
    return spec.parse(SPEC % netem_lines, "two.toml", options or {}, links)


def error_of(fn) -> str:
    with pytest.raises(UserError) as e:
        fn()
    return str(e.value)


def test_shared_table_both_directions_per_end_merged_over_it():
    t = parse('netem = { delay_us = 250, jitter_us = 20 }\nnetem_b = { loss_pct = 1 }')
    w = t.links[0]
    assert (w.netem_a.delay_us, w.netem_a.jitter_us, w.netem_a.loss_pct) == (250, 20, 0)
    assert (w.netem_b.delay_us, w.netem_b.jitter_us, w.netem_b.loss_pct) == (250, 20, 1)
    assert t.links[1].netem_a is None and t.links[1].netem_b is None


def test_rtt_from_an_option_is_split_half_each_way():
    w = parse('netem = { rtt_us = "{rtt_us}" }', options={"rtt_us": "500"}).links[0]
    assert w.netem_a.delay_us == w.netem_b.delay_us == 250
    assert parse('netem = { rtt_us = "{rtt_us}" }', options={"rtt_us": "0"}).links[0].netem_a is None


def test_command_line_link_name_and_interface():
    t = parse(links=["wire:delay_us=200"])
    assert t.links[0].netem_a.delay_us == t.links[0].netem_b.delay_us == 200
    t = parse(links=["pp-t-c0:delay_us=200"])                 # one end's egress: the request leg only
    assert t.links[0].netem_a.delay_us == 200 and t.links[0].netem_b is None
    t = parse('netem_a = { delay_us = 100 }', links=["wire,delay_us=300", "pp-t-s0:loss_pct=2"])
    assert (t.links[0].netem_a.delay_us, t.links[0].netem_b.delay_us, t.links[0].netem_b.loss_pct) == (300, 300, 2)


def test_a_bridged_end_is_held_at_its_peer_and_only_rate_goes_between_bridges():
    t = parse(links=["bridged:delay_us=50"])
    assert netem.hold_point(t, t.links[1], "a") == ("pp-t-s", "PREROUTING", ["-i", "pp-t-b1"])
    assert netem.hold_point(t, t.links[1], "b") == ("pp-t-s", "POSTROUTING", ["-o", "pp-t-b1"])
    assert netem.holds(t) == [("pp-t-s", "prerouting"), ("pp-t-s", "postrouting")]
    assert parse(links=["wire:rate_mbit=100"]).links[0].netem_a.tbf_args()[:3] == ["tbf", "rate", "100mbit"]


@pytest.mark.parametrize("lines, links, words", [
    ('netem = { delay_us = -5 }', None, ["two.toml", "links[0].netem.delay_us", "negative"]),
    ('netem_a = { loss_pct = 101 }', None, ["two.toml", "links[0].netem_a.loss_pct", "0..100"]),
    ('netem = { delay = 5 }', None, ["links[0].netem.delay", "unknown netem key"]),
    ('netem = { delay_us = 10, jitter_us = 20 }', None, ["jitter_us", "exceeds delay_us"]),
    ('netem = { delay_us = "{nope}" }', None, ["links[0].netem.delay_us", "unknown option 'nope'"]),
    ('netem = { delay_us = true }', None, ["must be a number"]),
    ('netem_a = { rtt_us = 5 }', None, ["rtt_us only in the shared"]),
    ('', ["wire:delay_us=-1"], ["--link wire.delay_us", "negative"]),
    ('', ["wire:loss_pct=150"], ["--link wire.loss_pct", "0..100"]),
    ('', ["nosuch:delay_us=1"], ["no link or interface named 'nosuch'", "links: wire, bridged"]),
    ('', ["wire"], ["no impairment given"]),
    ('', ["wire:delay_us"], ["is not KEY=VALUE"]),
])
def test_bad_impairments_are_one_clear_error_naming_file_and_key(lines, links, words):
    msg = error_of(lambda: parse(lines, links))
    assert "\n" not in msg
    for w in words:
        assert w in msg, (w, msg)


def test_builtins_name_their_links():
    assert spec.load("nic", {}, ["wire:delay_us=1"]).links[0].name == "wire"
    cz = spec.load("cross-zone", {"rtt_us": "400"})
    assert cz.links[0].netem_a.delay_us == cz.links[0].netem_b.delay_us == 200


def test_compare_entry_carries_a_link():
    a = cli_args.build_parser().parse_args(["compare", "nic", "nic:link=wire:delay_us=250"])
    ns, _ = apply(a, parse_variant("nic:link=wire:delay_us=250:jitter_us=20"))
    assert ns.link == ["wire,delay_us=250,jitter_us=20"] and a.link == []
    assert spec.load("nic", {}, ns.link).links[0].netem_b.jitter_us == 20


def test_held_time_is_its_own_stage_carved_out_of_the_wire():
    rows = [{"kind": "wire", "role": "backend", "leg": "request", "count": 1000, "sum_ns": 230_000 * 1000},
            {"kind": "delay", "role": "kernel", "leg": "request", "dev": "pp-nic-c", "count": 1000,
             "sum_ns": 200_000 * 1000},
            {"kind": "qdisc", "role": "kernel", "leg": "request", "dev": "pp-nic-c", "count": 1000,
             "sum_ns": 20_000 * 1000},
            {"kind": "proc", "role": "backend", "leg": "server", "count": 1000, "sum_ns": 10_000 * 1000}]
    df = pd.DataFrame([r | {"hop": "", "hook": "", "netns": "", "hist": None} for r in rows]).fillna("")
    v = views.latency_view(df, 1000, 240.0)
    got = {(s["name"], s["leg"]): s["us_per_txn"] for s in v["stages"]}
    assert got[("delay.pp-nic-c", "request")] == pytest.approx(200.0)
    assert got[("qdisc.pp-nic-c", "request")] == pytest.approx(20.0)
    assert got[("wire.backend", "request")] == pytest.approx(10.0)
    assert v["total_us"] == pytest.approx(240.0)


def test_a_delay_line_that_exited_is_named(tmp_path):
    import subprocess

    from pathprof.agent.host.journal import Journal
    j = Journal("t", tmp_path)
    gone = subprocess.Popen(["true"])
    gone.wait()
    alive = subprocess.Popen(["sleep", "30"])
    try:
        j.record("process", pid=gone.pid, start_time=None, argv=["/p/pp-delayline", "4200", "1", "0", "0"],
                 netns="pp-t-c")
        j.record("process", pid=alive.pid, start_time=None, argv=["/p/pp-delayline", "4201", "1", "0", "0"],
                 netns="pp-t-s")
        j.record("process", pid=gone.pid, start_time=None, argv=["postgres"], netns="pp-t-s")
        assert delayline.dead_delay_lines(j) == ["the link delay line (NFQUEUE 4200 in pp-t-c) exited"]
    finally:
        alive.kill()
        alive.wait()


def test_a_lossy_link_takes_the_probes_always_on_unless_a_schedule_was_chosen():
    """Loss on a link with the default schedule: always on (a recovery wait begun before a window has no start in
    it: -10 ... -19 % windowed), said in a note; a schedule the user gave, or no loss, is kept."""
    from types import SimpleNamespace

    from pathprof.agent.probing.windows import DEFAULT_PERIOD_S, DEFAULT_WINDOW_S
    from pathprof.agent.run.options import RunOptions, lossy_schedule
    from pathprof.topologies.impairments import Netem

    def base(**kw):
        return RunOptions(topology="nic", workload=None, **kw)

    def topo(loss):
        link = SimpleNamespace(impairments=lambda: [(object(), Netem(loss_pct=loss, delay_us=100))])
        return SimpleNamespace(links=[link])
    opts, note = lossy_schedule(base(), topo(1.0))
    assert opts.probe_period_s == 0.0 and note and opts.schedule_note == note and "loses packets" in note
    assert lossy_schedule(base(), topo(0.0)) == (base(), None)          # delay alone: windows kept
    mine = base(probe_window_s=1.0, probe_period_s=DEFAULT_PERIOD_S)
    assert lossy_schedule(mine, topo(2.0)) == (mine, None)                          # the user's schedule
    off = base(probes="off")
    assert lossy_schedule(off, topo(2.0)) == (off, None)
    assert (DEFAULT_WINDOW_S, DEFAULT_PERIOD_S) == (base().probe_window_s, base().probe_period_s)
