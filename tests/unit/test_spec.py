"""Topology specs: every built-in parses, variants follow options, and bad specs are refused with the file and
the key named. No root needed: nothing is built."""
from __future__ import annotations

import ipaddress

import pytest
from pathprof.errors import UserError
from pathprof.topologies import services, spec

BENCH = ipaddress.ip_network("198.18.0.0/15")

MINIMAL = """
name = "mine"
description = "a user's path"

[[hosts]]
name = "a"
netns = "pp-ut-a"

[[hosts]]
name = "b"
netns = "pp-ut-b"

[[links]]
kind = "veth"
a = { host = "a", ifname = "pp-ut-a0", address = "198.18.40.1/24" }
b = { host = "b", ifname = "pp-ut-b0", address = "198.18.40.2/24" }

[postgres]
host = "b"
listen = "198.18.40.2"

[client]
host = "a"
[client.targets.wire]
address = "198.18.40.2"
"""


def parse(text: str, **options):
    return spec.parse(text, "my-path.toml", options)


def test_every_builtin_parses_with_pp_names_and_bench_addresses():
    names = spec.builtin_names()
    for expected in ("docker-bridge", "docker-dnat", "pgbouncer", "pgbouncer-3host", "pgpool", "pgpool-3host",
                     "kvm-tap", "unix", "loopback", "nic"):
        assert expected in names
    for name in names:
        t = spec.load(name)
        assert t.name == name and t.description, name
        assert "\n" not in t.description, f"{name}: description must be one line"
        for h in t.hosts.values():
            assert h.netns is None or h.netns.startswith("pp-"), name
        ifnames = [b.name for b in t.bridges] + [e.ifname for l in t.links for e in (l.a, l.b) if e]
        assert all(n.startswith("pp-") and len(n) <= 15 for n in ifnames), (name, ifnames)
        assert len(ifnames) == len(set(ifnames)), name
        addrs = [b.address for b in t.bridges if b.address] + \
                [e.address for l in t.links for e in (l.a, l.b) if e and e.address]
        for a in addrs:
            assert ipaddress.ip_interface(a).ip in BENCH, (name, a)
        for c in t.chains:
            assert c.name.startswith("PP-"), (name, c.name)
        for s in t.services:
            services.create(s)      # options valid for the kind


def test_docker_dnat_variants():
    on = spec.load("docker-dnat")
    assert on.options == {"userland_proxy": "on", "target": "published-localhost"}
    assert [s.kind for s in on.services] == ["docker-proxy"]
    out = [r.args for r in on.rules if r.table == "nat" and r.chain == "OUTPUT"]
    assert out == [["!", "-d", "127.0.0.0/8", "-m", "addrtype", "--dst-type", "LOCAL", "-j", "PP-DOCKER"]]
    assert on.client.target == "published-localhost"
    assert (on.client.targets["published-localhost"].host, on.client.targets["published-localhost"].port) == \
        ("127.0.0.1", 49155)
    assert "net.ipv4.conf.pp-docker0.route_localnet" not in on.hosts["host"].sysctls
    assert on.hosts["host"].sysctls["net.ipv4.ip_forward"] == "1"

    off = spec.load("docker-dnat", {"userland_proxy": "off", "target": "container"})
    assert off.services == []
    out = [r.args for r in off.rules if r.table == "nat" and r.chain == "OUTPUT"]
    assert out == [["-m", "addrtype", "--dst-type", "LOCAL", "-j", "PP-DOCKER"]]
    assert off.hosts["host"].sysctls["net.ipv4.conf.pp-docker0.route_localnet"] == "1"
    dnat = [r.args for r in off.rules if r.chain == "PP-DOCKER" and "DNAT" in r.args]
    assert len(dnat) == 1 and "-i" not in dnat[0]           # hairpin: no `! -i pp-docker0`
    masq = [r.args for r in off.rules if r.chain == "POSTROUTING" and "--src-type" in r.args]
    assert masq == [["-m", "addrtype", "--src-type", "LOCAL", "-o", "pp-docker0", "-j", "MASQUERADE"]]
    assert off.client.target == "container"


def test_pooler_variants():
    assert spec.load("pgbouncer").services[0].options["pool_mode"] == "session"
    t = spec.load("pgbouncer-3host", {"pool_mode": "transaction"})
    assert len(t.services) == 1 and t.services[0].options["pool_mode"] == "transaction"
    assert spec.load("pgpool", {"target": "direct"}).client.target == "direct"
    t = spec.load("pgpool-3host")
    assert len({h.netns for h in t.hosts.values()}) == 4          # client, pooler, db, switch
    assert t.postgres.host == "db" and t.services[0].host == "pooler" and t.client.host == "client"


def test_bad_option_value_and_unknown_option_are_refused():
    with pytest.raises(UserError, match=r"docker-dnat.*userland_proxy = 'maybe' is not one of on, off"):
        spec.load("docker-dnat", {"userland_proxy": "maybe"})
    with pytest.raises(UserError, match=r"docker-dnat.*no option 'colour'.*target, userland_proxy"):
        spec.load("docker-dnat", {"colour": "red"})
    with pytest.raises(UserError, match=r"not one of published-localhost"):
        spec.load("docker-dnat", {"target": "nowhere"})


def test_prepared_statements_refused_with_transaction_pooling():
    t = spec.load("pgbouncer", {"pool_mode": "transaction"})
    with pytest.raises(UserError, match="cannot carry protocol-level prepared statements"):
        services.check_workload(t, "prepared", False)
    services.check_workload(t, "simple", False)
    services.check_workload(t, "extended", True)
    services.check_workload(spec.load("pgbouncer"), "prepared", False)
    with pytest.raises(UserError, match="in statement pooling"):        # the same with a server per statement
        services.check_workload(spec.load("pgbouncer", {"pool_mode": "statement"}), "prepared", False)


def test_minimal_user_spec_parses():
    t = parse(MINIMAL)
    assert t.source == "my-path.toml" and t.client.targets["wire"].port == 5432


@pytest.mark.parametrize("old,new,key,problem", [
    ('address = "198.18.40.1/24"', 'address = "10.0.0.1/24"', "links[0].a.address", "outside 198.18.0.0/15"),
    ('listen = "198.18.40.2"', 'listen = "192.168.1.2"', "postgres.listen", "outside 198.18.0.0/15"),
    ('netns = "pp-ut-a"', 'netns = "mynet"', "hosts[0].netns", "must start with 'pp-'"),
    ('ifname = "pp-ut-a0"', 'ifname = "eth7"', "links[0].a.ifname", "must start with 'pp-'"),
    ('ifname = "pp-ut-a0"', 'ifname = "pp-much-too-long0"', "links[0].a.ifname", "longer than 15"),
    ('[postgres]\nhost = "b"', '[postgres]\nhost = "c"', "postgres.host", "unknown host 'c'"),
    ('[client]\nhost = "a"', '[client]\nhost = "nowhere"', "client.host", "unknown host 'nowhere'"),
    ('address = "198.18.40.1/24"', 'address = "198.18.40.1"', "links[0].a.address", "needs a prefix length"),
    ('name = "mine"', 'name = "mine"\n[[service]]\nkind = "x"', "service", "unknown section"),
])
def test_validation_errors_name_file_and_key(old, new, key, problem):
    assert old in MINIMAL
    with pytest.raises(UserError) as e:
        parse(MINIMAL.replace(old, new, 1))
    msg = str(e.value)
    assert msg.startswith("my-path.toml: "), msg
    assert key in msg and problem in msg, msg


def service_spec(kind: str, host: str, options: str) -> str:
    return MINIMAL + f'\n[[services]]\nkind = "{kind}"\nhost = "{host}"\nname = "myproxy"\n{options}\n'


@pytest.mark.parametrize("kind,host,options,key,problem", [
    ("haproxy", "a", "", "services[0].kind", "unknown service kind 'haproxy' (known: command, docker-proxy"),
    ("command", "a", 'argv = ["x"]', "services[0].ready_port", "is required"),
    ("command", "a", 'argv = "x --y"\nready_port = 7000', "services[0].argv", "must be list"),
    ("command", "a", 'argv = ["x"]\nready_port = 7000\nready_prot = 1', "services[0].ready_prot", "unknown option"),
    ("pgbouncer", "a", 'pool_mode = "per-query"', "services[0].pool_mode",
     "not one of session, transaction, statement"),
    ("pgpool", "a", 'port = "9999"', "services[0].port", "must be int"),
    ("docker-proxy", "a", 'host_port = 49155', "services[0].container_ip", "is required"),
    ("pgpool", "z", "", "services[0].host", "unknown host 'z'"),
])
def test_service_validation(kind, host, options, key, problem):
    with pytest.raises(UserError) as e:
        parse(service_spec(kind, host, options))
    msg = str(e.value)
    assert msg.startswith("my-path.toml: ") and key in msg and problem in msg, msg


def test_command_service_in_user_spec():
    t = parse(service_spec("command", "a", (
        'argv = ["/usr/bin/myproxy", "--to", "{postgres_address}:{postgres_port}"]\n'
        'ready_port = 7000\nready_address = "198.18.40.1"')))
    svc = services.create(t.services[0])
    assert svc.hop == "myproxy" and svc.opts["ready_port"] == 7000 and svc.opts["ready_timeout_s"] == 30


def test_when_refers_to_unknown_option():
    text = MINIMAL + '\n[[routes]]\nhost = "a"\ndst = "default"\nvia = "198.18.40.2"\nwhen = { speed = "fast" }\n'
    with pytest.raises(UserError, match=r"my-path.toml: routes\[0\].when: refers to unknown option 'speed'"):
        parse(text)


def test_sysctls_section_and_variants():
    text = MINIMAL.replace('name = "mine"', 'name = "mine"\n[options]\nfwd = "on"', 1) + """
[[sysctls]]
host = "a"
name = "net.ipv4.ip_forward"
value = 1
when = { fwd = "on" }
"""
    assert parse(text).hosts["a"].sysctls == {"net.ipv4.ip_forward": "1"}
    assert parse(text, fwd="off").hosts["a"].sysctls == {}
    with pytest.raises(UserError, match=r"sysctls\[0\].value"):
        parse(text.replace("value = 1", "value = true"))


def test_unknown_topology_lists_builtins():
    with pytest.raises(UserError, match="unknown topology 'dockr'.*docker-dnat"):
        spec.load("dockr")
