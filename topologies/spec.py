"""Topology specs: what a path is, as data.

A spec is a TOML file. Hosts are network namespaces (a host without `netns` is the root namespace), links are
veth pairs (or a tap) whose ends sit in a host or on a bridge, `[postgres]` places the server, `[client]` says
where pgbench runs and what it connects to, `[[services]]` are the processes on the path (each one a hop), and
`[[chains]]`/`[[rules]]` are iptables state applied in a host. Anything may carry `when = {option = "value"}`
so one spec can describe variants (e.g. dockerd's userland-proxy on/off); `[options]` holds the defaults.
"""
from __future__ import annotations

import ipaddress
import re
import tomllib
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from pathprof.errors import UserError
from pathprof.topologies import impairments as netem_mod
from pathprof.topologies.impairments import Netem

BENCH_NET = ipaddress.ip_network("198.18.0.0/15")
NAME_PREFIX = "pp-"
CHAIN_PREFIXES = ("PP-", "pp-")
IFNAMSIZ = 15
IPTABLES_TABLES = ("filter", "nat", "mangle", "raw", "security")


class SpecError(UserError):
    def __init__(self, source: str, key: str, problem: str):
        super().__init__(f"{source}: {key}: {problem}")


@dataclass
class Host:
    name: str
    netns: str | None = None
    sysctls: dict[str, str] = field(default_factory=dict)


@dataclass
class Bridge:
    name: str
    host: str
    address: str | None = None


@dataclass
class LinkEnd:
    ifname: str
    host: str | None = None
    bridge: str | None = None
    address: str | None = None


@dataclass
class Link:
    kind: str                      # "veth" | "tap"
    a: LinkEnd
    b: LinkEnd | None = None       # a tap has one end (the guest holds the other)
    name: str | None = None        # what `--link NAME:...` calls it
    netem_a: Netem | None = None   # impairment on end a's egress (a -> b), topologies.impairments
    netem_b: Netem | None = None   # ... on end b's egress (b -> a)

    def impairments(self) -> list[tuple[LinkEnd, Netem]]:
        return [(e, n) for e, n in ((self.a, self.netem_a), (self.b, self.netem_b)) if e is not None and n]


@dataclass
class Route:
    host: str
    dst: str
    via: str


@dataclass
class Chain:
    host: str
    table: str
    name: str
    key: str = ""                  # where it is in the spec (chains[3]), for error messages


@dataclass
class Rule:
    host: str
    table: str
    chain: str
    args: list[str]
    position: str = "append"       # "append" | "insert" (insert at the top, as dockerd does for jumps)
    key: str = ""                  # where it is in the spec (rules[12]), for error messages


@dataclass
class Postgres:
    host: str
    listen: str = "127.0.0.1"      # an address on the host, or "unix"
    port: int = 5432
    kind: str = "local"            # "local" (owned cluster in the host) | "guest" (a qemu guest serves it)


@dataclass
class Service:
    kind: str                      # docker-proxy | pgbouncer | pgpool | qemu-guest | command
    host: str
    name: str                      # the hop's name in reports
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class Target:
    host: str | None               # address pgbench connects to; None with unix
    port: int | None = None
    unix: bool = False


@dataclass
class Client:
    host: str
    targets: dict[str, Target]
    target: str                    # the default target's name


@dataclass
class Topology:
    name: str
    description: str
    hosts: dict[str, Host]
    postgres: Postgres
    client: Client
    bridges: list[Bridge] = field(default_factory=list)
    links: list[Link] = field(default_factory=list)
    routes: list[Route] = field(default_factory=list)
    chains: list[Chain] = field(default_factory=list)
    rules: list[Rule] = field(default_factory=list)
    services: list[Service] = field(default_factory=list)
    options: dict[str, str] = field(default_factory=dict)
    source: str = ""
    text: str = ""

    def netns_of(self, host: str) -> str | None:
        return self.hosts[host].netns

    def namespaces(self) -> list[str | None]:
        return [h.netns for h in self.hosts.values()]

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("text", None)
        return d


def builtin_names() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("pathprof.topologies").iterdir() if p.name.endswith(".toml"))


def builtin_text(name: str) -> str:
    return (resources.files("pathprof.topologies") / f"{name}.toml").read_text()


def load(name_or_path: str, options: dict[str, str] | None = None, links: list[str] | None = None) -> Topology:
    """A built-in by name, or a user's TOML file by path; options override the spec's [options], `links` are
    `--link WHERE:KEY=VALUE,...` impairments laid over the spec's (topologies.impairments)."""
    if name_or_path in builtin_names():
        text, source = builtin_text(name_or_path), f"built-in topology '{name_or_path}'"
    elif "/" in name_or_path or name_or_path.endswith(".toml"):
        p = Path(name_or_path)
        if not p.is_file():
            raise UserError(f"topology file {p} does not exist")
        text, source = p.read_text(), str(p)
    else:
        raise UserError(f"unknown topology '{name_or_path}'; known: {', '.join(builtin_names())} "
                        "(or give a path to a .toml file)")
    return parse(text, source, options or {}, links)


def parse(text: str, source: str, options: dict[str, str] | None = None, links: list[str] | None = None
          ) -> Topology:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{source}: not valid TOML: {e}") from None
    return _Parser(raw, source, text, options or {}, links or []).topology()


# Top-level keys a spec may have; anything else is a typo (e.g. [[service]]) and is refused, naming the key.
SECTIONS = {"name", "description", "options", "option_choices", "hosts", "bridges", "links", "routes", "sysctls",
            "chains", "rules", "services", "postgres", "client", "metadata"}


class _Parser:
    def __init__(self, raw: dict, source: str, text: str, overrides: dict[str, str], links: list[str] | None = None):
        self.raw, self.source, self.text, self.link_args = raw, source, text, links or []
        for key in raw:
            if key not in SECTIONS:
                raise self.err(key, f"unknown section (known: {', '.join(sorted(SECTIONS))})")
        self.options = {k: str(v) for k, v in raw.get("options", {}).items()}
        # [option_choices] lists the values an option may take, so `--userland-proxy maybe` is refused
        # instead of silently matching no variant.
        self.choices = {k: [str(x) for x in v] for k, v in raw.get("option_choices", {}).items()}
        for k in self.choices:
            if k not in self.options:
                raise self.err(f"option_choices.{k}", "has no default in [options]")
        for k, v in list(overrides.items()) + [(k, v) for k, v in self.options.items() if k not in overrides]:
            if k not in self.options:
                known = ", ".join(sorted(self.options)) or "none"
                raise UserError(f"{source}: has no option '{k}' (its options: {known})")
            if k in self.choices and str(v) not in self.choices[k]:
                raise UserError(f"{source}: option {k} = '{v}' is not one of {', '.join(self.choices[k])}")
            self.options[k] = str(v)

    def err(self, key: str, problem: str) -> SpecError:
        return SpecError(self.source, key, problem)

    def active(self, item: dict, key: str) -> bool:
        when = item.get("when", {})
        if not isinstance(when, dict):
            raise self.err(f"{key}.when", "must be a table like {userland_proxy = \"on\"}")
        for opt, want in when.items():
            if opt not in self.options:
                raise self.err(f"{key}.when", f"refers to unknown option '{opt}'")
            allowed = want if isinstance(want, list) else [want]
            if self.options[opt] not in [str(a) for a in allowed]:
                return False
        return True

    def items(self, section: str) -> list[tuple[str, dict]]:
        value = self.raw.get(section, [])
        if not isinstance(value, list):
            raise self.err(section, "must be an array of tables ([[" + section + "]])")
        return [(f"{section}[{i}]", v) for i, v in enumerate(value) if self.active(v, f"{section}[{i}]")]

    def need(self, item: dict, key: str, name: str, typ=str):
        if name not in item:
            raise self.err(f"{key}.{name}", "is required")
        value = item[name]
        if not isinstance(value, typ):
            raise self.err(f"{key}.{name}", f"must be {typ.__name__}, not {type(value).__name__}")
        return value

    def pp_name(self, key: str, name: str, limit: int | None = None) -> str:
        if not name.startswith(NAME_PREFIX):
            raise self.err(key, f"'{name}' must start with '{NAME_PREFIX}' (pathprof only creates pp- objects)")
        if limit and len(name) > limit:
            raise self.err(key, f"'{name}' is longer than {limit} characters (a Linux interface name limit)")
        return name

    def address(self, key: str, value: str, cidr: bool) -> str:
        try:
            net = ipaddress.ip_interface(value) if cidr else ipaddress.ip_address(value)
        except ValueError:
            raise self.err(key, f"'{value}' is not an IPv4 address{' with /prefix' if cidr else ''}") from None
        ip = net.ip if cidr else net
        if ip not in BENCH_NET and not ip.is_loopback:
            raise self.err(key, f"{value} is outside 198.18.0.0/15 (benchmark traffic stays in RFC 2544 space)")
        if cidr and "/" not in value:
            raise self.err(key, f"'{value}' needs a prefix length, e.g. {value}/24")
        return value

    def table(self, key: str, item: dict, required: bool = False) -> str:
        t = self.need(item, key, "table") if required else item.get("table", "filter")
        if t not in IPTABLES_TABLES:
            raise self.err(f"{key}.table", f"'{t}' is not one of {', '.join(IPTABLES_TABLES)}")
        return t

    def link_name(self, key: str, link: dict, links: list[Link]) -> str | None:
        name = link.get("name")
        if name is None:
            return None
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
            raise self.err(f"{key}.name", f"{name!r} must be a word of letters, digits, '.', '_', '-'")
        if any(x.name == name for x in links):
            raise self.err(f"{key}.name", f"'{name}' names two links")
        return name

    def impair(self, links: list[Link], raws: list[tuple[str, dict]]) -> None:
        """netem / netem_a / netem_b of each link, then the command line's --link over them (topologies.impairments):
        spec shared < spec per-end < --link NAME < --link IFNAME."""
        layers = []
        for link, (key, raw) in zip(links, raws):
            where = f"{self.source}: {key}"
            own = {}
            for side in ("a", "b"):
                if f"netem_{side}" in raw and getattr(link, side) is None:
                    raise self.err(f"{key}.netem_{side}", "this link has no end b (a tap: use netem or netem_a)")
                own[side] = netem_mod.read_table(raw.get(f"netem_{side}", {}), f"{where}.netem_{side}",
                                                 self.options, shared=False)
            layers.append([netem_mod.read_table(raw.get("netem", {}), f"{where}.netem", self.options, True),
                           own["a"], own["b"], {}, {"a": {}, "b": {}}])
        for text in self.link_args:
            target, pairs = netem_mod.parse_link_arg(text)
            hit = False
            for link, layer in zip(links, layers):
                if link.name == target:
                    layer[3].update(netem_mod.read_table(pairs, f"--link {target}", self.options, shared=True))
                    hit = True
                for side in ("a", "b"):
                    end = getattr(link, side)
                    if end is not None and end.ifname == target:
                        layer[4][side].update(netem_mod.read_table(pairs, f"--link {target}", self.options, False))
                        hit = True
            if not hit:
                names = ", ".join(x.name for x in links if x.name) or "none"
                ifs = ", ".join(e.ifname for x in links for e in (x.a, x.b) if e is not None) or "none"
                raise UserError(f"--link '{text}': {self.source} has no link or interface named '{target}' "
                                f"(links: {names}; interfaces: {ifs})")
        for link, (key, _), (shared, own_a, own_b, cli_shared, cli_own) in zip(links, raws, layers):
            where = f"{self.source}: {key}"
            link.netem_a = netem_mod.resolve({**shared, **own_a, **cli_shared}, cli_own["a"], f"{where}.netem_a")
            if link.b is not None:
                link.netem_b = netem_mod.resolve({**shared, **own_b, **cli_shared}, cli_own["b"], f"{where}.netem_b")
            for side, other in (("a", "b"), ("b", "a")):
                end, peer, n = getattr(link, side), getattr(link, other), getattr(link, f"netem_{side}")
                if n and n.delay_line() and end.host is None and (peer is None or peer.host is None):
                    raise self.err(f"{key}.netem_{side}", f"a delay on {end.ifname} needs it or its peer in a host (a "
                                   "tap into a guest, or a veth between two bridges, cannot carry one; rate_mbit can)")

    def host_ref(self, key: str, name: str, hosts: dict) -> str:
        if name not in hosts:
            raise self.err(key, f"unknown host '{name}' (hosts: {', '.join(hosts)})")
        return name

    def topology(self) -> Topology:
        """The whole spec, section by section; each section's problems name their key."""
        name = self.raw.get("name")
        if not isinstance(name, str) or not name:
            raise self.err("name", "is required (a short name for reports)")
        hosts = self._hosts()
        bridges = self._bridges(hosts)
        links = self._links(hosts, {b.name for b in bridges})
        self.impair(links, self.items("links"))
        routes = [Route(self.host_ref(f"{k}.host", self.need(x, k, "host"), hosts), self.need(x, k, "dst"),
                        self.address(f"{k}.via", self.need(x, k, "via"), False))
                  for k, x in self.items("routes")]
        chains, rules, services = self._chains(hosts), self._rules(hosts), self._services(hosts)
        postgres = self._postgres(hosts)
        return Topology(name, self.raw.get("description", ""), hosts, postgres, self._client(hosts, postgres),
                        bridges, links, routes, chains, rules, services, dict(self.options), self.source, self.text)

    def _hosts(self) -> dict[str, Host]:
        hosts: dict[str, Host] = {}
        for key, h in self.items("hosts"):
            hname = self.need(h, key, "name")
            netns = h.get("netns")
            if netns is not None:
                self.pp_name(f"{key}.netns", netns)
            sysctls = {k: str(v) for k, v in h.get("sysctls", {}).items()}
            hosts[hname] = Host(hname, netns, sysctls)
        if not hosts:
            hosts["host"] = Host("host")
        # [[sysctls]] (host, name, value, optional `when`) add to a host's sysctls: variants such as
        # route_localnet only with dockerd's userland proxy off need the `when` that a host table cannot carry.
        for key, x in self.items("sysctls"):
            h = hosts[self.host_ref(f"{key}.host", x.get("host", "host"), hosts)]
            value = x.get("value")
            if not isinstance(value, (str, int)) or isinstance(value, bool):
                raise self.err(f"{key}.value", "is required (a string or an integer)")
            h.sysctls[self.need(x, key, "name")] = str(value)
        return hosts

    def _bridges(self, hosts) -> list[Bridge]:
        return [Bridge(self.pp_name(f"{key}.name", self.need(b, key, "name"), IFNAMSIZ),
                       self.host_ref(f"{key}.host", b.get("host", "host"), hosts),
                       self.address(f"{key}.address", b["address"], True) if "address" in b else None)
                for key, b in self.items("bridges")]

    def _links(self, hosts, bridge_names: set[str]) -> list[Link]:
        links = []
        for key, link in self.items("links"):
            kind = link.get("kind", "veth")
            if kind not in ("veth", "tap"):
                raise self.err(f"{key}.kind", f"'{kind}' is not one of veth, tap")
            ends = [self._link_end(key, side, link.get(side), kind, hosts, bridge_names) for side in ("a", "b")]
            links.append(Link(kind, ends[0], ends[1], self.link_name(key, link, links)))
        return links

    def _link_end(self, key: str, side: str, e, kind: str, hosts, bridge_names: set[str]) -> LinkEnd | None:
        if e is None:
            if side == "b" and kind == "tap":
                return None
            raise self.err(f"{key}.{side}", "is required")
        k = f"{key}.{side}"
        end = LinkEnd(self.pp_name(f"{k}.ifname", self.need(e, k, "ifname"), IFNAMSIZ))
        if "bridge" in e:
            if e["bridge"] not in bridge_names:
                raise self.err(f"{k}.bridge", f"unknown bridge '{e['bridge']}'")
            end.bridge = e["bridge"]
        else:
            end.host = self.host_ref(f"{k}.host", e.get("host", "host"), hosts)
        if "address" in e:
            end.address = self.address(f"{k}.address", e["address"], True)
        return end

    def _chains(self, hosts) -> list[Chain]:
        chains = []
        for key, c in self.items("chains"):
            cname = self.need(c, key, "name")
            if not cname.startswith(CHAIN_PREFIXES):
                raise self.err(f"{key}.name", f"'{cname}' must start with PP- (pathprof only creates its own chains)")
            chains.append(Chain(self.host_ref(f"{key}.host", c.get("host", "host"), hosts),
                                self.table(key, c, required=True), cname, key))
        return chains

    def _rules(self, hosts) -> list[Rule]:
        rules = []
        for key, x in self.items("rules"):
            args = self.need(x, key, "args", list)
            if not all(isinstance(a, str) and "\n" not in a for a in args):
                raise self.err(f"{key}.args", "must be a list of strings (iptables arguments, one line)")
            pos = x.get("position", "append")
            if pos not in ("append", "insert"):
                raise self.err(f"{key}.position", "must be 'append' or 'insert'")
            rules.append(Rule(self.host_ref(f"{key}.host", x.get("host", "host"), hosts),
                              self.table(key, x), self.need(x, key, "chain"), args, pos, key))
        return rules

    def _services(self, hosts) -> list[Service]:
        from pathprof.topologies import services as svc  # late: services import this module
        services = []
        for key, s in self.items("services"):
            kind = self.need(s, key, "kind")
            if kind not in svc.KINDS:
                raise self.err(f"{key}.kind", f"unknown service kind '{kind}' (known: {', '.join(sorted(svc.KINDS))})")
            opts = {k: self._option_value(f"{key}.{k}", v, svc.option_type(kind, k))
                    for k, v in s.items() if k not in ("kind", "host", "name", "when")}
            for okey, problem in svc.option_problems(kind, opts):
                raise self.err(f"{key}.{okey}", problem)
            services.append(Service(kind, self.host_ref(f"{key}.host", s.get("host", "host"), hosts),
                                    s.get("name", kind), opts))
        return services

    def _option_value(self, where: str, value, want):
        """A service option's value; the string "{NAME}" is the spec option NAME (`--option NAME=...`), converted
        to the type the service wants (an int option takes "4")."""
        m = re.fullmatch(r"\{([A-Za-z_][A-Za-z0-9_]*)\}", value) if isinstance(value, str) else None
        if not m:
            return value
        if m.group(1) not in self.options:
            raise self.err(where, f"refers to unknown option '{m.group(1)}'")
        text = str(self.options[m.group(1)])
        if want is int:
            try:
                return int(text)
            except ValueError:
                raise UserError(f"--option {m.group(1)}={text}: must be a whole number ({where})") from None
        return text

    def _postgres(self, hosts) -> Postgres:
        pg = self.raw.get("postgres")
        if not isinstance(pg, dict):
            raise self.err("postgres", "is required ([postgres] with host, listen, port)")
        listen = pg.get("listen", "127.0.0.1")
        if listen != "unix":
            self.address("postgres.listen", listen, False)
        port = pg.get("port", 5432)
        if not isinstance(port, int) or not 1 <= port <= 65535:
            raise self.err("postgres.port", f"{port!r} is not a TCP port")
        postgres = Postgres(self.host_ref("postgres.host", pg.get("host", "host"), hosts), listen, port,
                            pg.get("kind", "local"))
        if postgres.kind not in ("local", "guest"):
            raise self.err("postgres.kind", f"'{postgres.kind}' is not one of local, guest")
        return postgres

    def _client(self, hosts, postgres: Postgres) -> Client:
        cl = self.raw.get("client")
        if not isinstance(cl, dict):
            raise self.err("client", "is required ([client] with host and [client.targets.NAME])")
        targets = {}
        for tname, t in cl.get("targets", {}).items():
            k = f"client.targets.{tname}"
            if not self.active(t, k):
                continue
            if t.get("unix"):
                targets[tname] = Target(None, t.get("port", postgres.port), unix=True)
            else:
                targets[tname] = Target(self.address(f"{k}.address", self.need(t, k, "address"), False),
                                        int(t.get("port", postgres.port)))
        if not targets:
            raise self.err("client.targets", "needs at least one target")
        default = self.options.get("target", cl.get("target", next(iter(targets))))
        if default not in targets:
            raise self.err("client.target", f"'{default}' is not one of {', '.join(targets)}")
        return Client(self.host_ref("client.host", cl.get("host", "host"), hosts), targets, default)
