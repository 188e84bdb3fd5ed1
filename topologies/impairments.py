"""Link impairments: delay, jitter, loss and a rate limit on the egress of a link end.

How, on this project's kernel: it is built without sch_netem (`tc qdisc add ... netem` says "Specified qdisc
kind is unknown"), so delay, jitter and loss are pathprof's own delay line: an iptables NFQUEUE rule (mangle
table) on the end's egress hands each TCP packet to `pp-delayline` (probes/pp-delayline.c), which gives it
back to the kernel after the delay, in order, or drops it for loss. The kernel keeps the skb meanwhile, so the
probes follow the same packet across (stage delay.<dev>). The rate is a real tbf qdisc (stage qdisc.<dev>).
The delay line's own CPU time (a few µs per packet, in the component `other`) is the price of a kernel
without netem; its wakeups add a little to each hold, and the stage reports the hold as it happened.

In a spec, a link carries `netem = {...}` (both ends' egress: each direction gets the same impairment),
`netem_a = {...}` (the egress of end a only: a -> b) and/or `netem_b = {...}` (b -> a). A per-end table is
merged key by key over the shared one (the end's own value wins). Keys:

    delay_us   fixed one-way delay, µs (>= 0)
    jitter_us  +/- variation of the delay, µs (0 <= jitter_us <= delay_us; a negative delay would be clipped
               to 0 and skew the mean); netem keeps packet order, so TCP sees no reordering
    loss_pct   random loss, % of packets (0..100)
    rate_mbit  bandwidth limit, Mbit/s (> 0)
    rtt_us     shorthand, shared `netem` table only: delay_us = rtt_us / 2 on each end

A string value "{NAME}" is the spec option NAME (`--option NAME=...`), so a built-in can take an RTT from the
command line. `--link WHERE:KEY=VALUE,...` (or WHERE,KEY=VALUE,... where ':' is taken, as in compare
entries) adds the same keys from the command line: WHERE is a link's `name` (both directions, as `netem`) or
one end's interface name (that end's egress, as `netem_a`/`netem_b`); its values win over the spec's.

A netem qdisc is the root qdisc of the end's device, journaled before it is added and deleted at teardown.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from pathprof.agent.host import delayline, proc
from pathprof.errors import UserError

KEYS = ("delay_us", "jitter_us", "loss_pct", "rate_mbit")
SHARED_ONLY = ("rtt_us",)
QUEUE_BASE = 4200          # NFQUEUE numbers of the delay lines (per namespace, so fixed numbers do not collide)
_OPTION_REF = re.compile(r"^\{([A-Za-z_][A-Za-z0-9_]*)\}$")


@dataclass
class Netem:
    delay_us: float = 0.0
    jitter_us: float = 0.0
    loss_pct: float = 0.0
    rate_mbit: float | None = None

    def active(self) -> bool:
        return bool(self.delay_us or self.jitter_us or self.loss_pct or self.rate_mbit)

    def delay_line(self) -> bool:
        return bool(self.delay_us or self.jitter_us or self.loss_pct)

    def tbf_args(self) -> list[str]:
        """`tc qdisc ... tbf` for the rate: a bucket of one timer tick's worth of bytes (HZ >= 100), at least
        10 full-size frames, and a queue of up to 50 ms."""
        rate_bps = self.rate_mbit * 1e6
        burst = max(int(rate_bps / 8 / 100), 15140)
        return ["tbf", "rate", f"{self.rate_mbit:g}mbit", "burst", str(burst), "latency", "50ms"]

    def describe(self) -> str:
        parts = [f"delay {self.delay_us:g} µs"] if self.delay_us else []
        if self.jitter_us:
            parts.append(f"jitter {self.jitter_us:g} µs")
        if self.loss_pct:
            parts.append(f"loss {self.loss_pct:g} %")
        if self.rate_mbit:
            parts.append(f"rate {self.rate_mbit:g} Mbit/s")
        return ", ".join(parts) or "none"


def _number(value, where: str, key: str, options: dict[str, str]) -> float:
    if isinstance(value, str):
        m = _OPTION_REF.match(value.strip())
        if m:
            name = m.group(1)
            if name not in options:
                raise UserError(f"{where}.{key}: refers to unknown option '{name}'")
            value = options[name]
        try:
            value = float(value)
        except ValueError:
            raise UserError(f"{where}.{key}: '{value}' is not a number") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UserError(f"{where}.{key}: must be a number, not {type(value).__name__}")
    if value != value or value in (float("inf"), float("-inf")):
        raise UserError(f"{where}.{key}: must be a finite number")
    return float(value)


def read_table(table, where: str, options: dict[str, str], shared: bool) -> dict[str, float]:
    """A netem table's keys, checked one by one; `where` names it in errors (e.g. "spec.toml: links[0].netem")."""
    if not isinstance(table, dict):
        raise UserError(f"{where}: must be a table like {{ delay_us = 250, jitter_us = 20 }}")
    allowed = KEYS + (SHARED_ONLY if shared else ())
    out = {}
    for key, value in table.items():
        if key not in allowed:
            hint = " (rtt_us only in the shared `netem` table or a link-wide --link)" if key in SHARED_ONLY else ""
            raise UserError(f"{where}.{key}: unknown netem key (known: {', '.join(allowed)}){hint}")
        v = _number(value, where, key, options)
        if key in ("delay_us", "jitter_us", "rtt_us") and v < 0:
            raise UserError(f"{where}.{key}: {v:g} is negative (a delay is >= 0 µs)")
        if key == "loss_pct" and not 0 <= v <= 100:
            raise UserError(f"{where}.{key}: {v:g} is not a percentage in 0..100")
        if key == "rate_mbit" and v <= 0:
            raise UserError(f"{where}.{key}: {v:g} must be > 0 Mbit/s (leave it out for no limit)")
        out[key] = v
    if "rtt_us" in out:
        if "delay_us" in out:
            raise UserError(f"{where}: give rtt_us or delay_us, not both")
        out["delay_us"] = out.pop("rtt_us") / 2
    return out


def resolve(shared: dict[str, float], own: dict[str, float], where: str) -> Netem | None:
    """One end's impairment: its own keys over the shared ones; None when nothing is set."""
    merged = {**shared, **own}
    if not merged:
        return None
    n = Netem(**merged)
    if n.jitter_us > n.delay_us:
        raise UserError(f"{where}.jitter_us: {n.jitter_us:g} exceeds delay_us ({n.delay_us:g}): netem would clip "
                        "negative delays to 0 and skew the mean")
    return n if n.active() else None


def parse_link_arg(text: str) -> tuple[str, dict[str, str]]:
    """`--link WHERE:KEY=VALUE,...` or `WHERE,KEY=VALUE,...` -> (WHERE, {KEY: VALUE})."""
    where, sep, rest = text.partition(":")
    if not sep:
        where, _, rest = text.partition(",")
    where = where.strip()
    if not where or "=" in where:
        raise UserError(f"--link '{text}': expected NAME:KEY=VALUE,... (e.g. wire:delay_us=250,jitter_us=20)")
    pairs = {}
    for item in (x for x in rest.split(",") if x.strip()):
        k, eq, v = item.partition("=")
        if not eq or not k.strip():
            raise UserError(f"--link '{text}': '{item}' is not KEY=VALUE")
        pairs[k.strip()] = v.strip()
    if not pairs:
        raise UserError(f"--link '{text}': no impairment given (keys: {', '.join(KEYS + SHARED_ONLY)})")
    return where, pairs


def hold_point(topo, link, side: str) -> tuple[str | None, str, list[str]]:
    """Where the delay line holds end `side`'s egress: (netns, iptables chain, match). At the end's own host's
    POSTROUTING (-o end); for an end on a bridge (bridged packets skip iptables), at its peer's PREROUTING
    (-i peer), the same direction of the same wire."""
    end, peer = getattr(link, side), getattr(link, "b" if side == "a" else "a")
    if end.host is not None:
        return topo.netns_of(end.host), "POSTROUTING", ["-o", end.ifname]
    if peer is not None and peer.host is not None:
        return topo.netns_of(peer.host), "PREROUTING", ["-i", peer.ifname]
    raise UserError(f"{topo.source}: link {link.name or end.ifname}: a delay on {end.ifname} needs it or its peer "
                    "in a host (a tap into a guest, or a veth between two bridges, cannot carry one)")


def holds(topo) -> list[tuple[str | None, str]]:
    """(netns, hook) of every delay line of the topology: where the probes bracket the hold."""
    out = []
    for link in topo.links:
        for end, n in link.impairments():
            if n.delay_line():
                ns, chain, _ = hold_point(topo, link, "a" if end is link.a else "b")
                if (ns, chain.lower()) not in out:
                    out.append((ns, chain.lower()))
    return out


def impair(topo, journal, bridge_ns: dict, progress=lambda s: None) -> None:
    """Every impaired end: a tbf root qdisc for its rate, a delay line (daemon first, then its NFQUEUE rule) for
    its delay/jitter/loss. Everything journaled before it is created."""
    queue = QUEUE_BASE
    for link in topo.links:
        for end, n in link.impairments():
            progress(f"impairment on {end.ifname}: {n.describe()}")
            if n.rate_mbit:
                proc.which("tc")
                netns = bridge_ns[end.bridge] if end.bridge else topo.netns_of(end.host)
                journal.record("qdisc", name=end.ifname, netns=netns, qdisc="tbf")
                proc.run(netns, ["tc", "qdisc", "replace", "dev", end.ifname, "root", *n.tbf_args()])
            if n.delay_line():
                netns, chain, match = hold_point(topo, link, "a" if end is link.a else "b")
                delayline.start(journal, netns, chain, match, queue, n.delay_us, n.jitter_us, n.loss_pct)
                queue += 1
