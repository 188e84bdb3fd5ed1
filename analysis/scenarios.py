"""What-if scenarios for analysis.predict: a hop removed, a link's delay added, the commit's WAL flush taken out.

Pure functions over a model base (analysis.predict.Base): parse the user's words, refuse what the run cannot
support, and return the changed base.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from pathprof.errors import UserError

if TYPE_CHECKING:
    from pathprof.analysis.predict import Base

WAL_SETTINGS = {"synchronous_commit": ("off", "local"), "fsync": ("off",)}


def _links(spec: dict) -> dict[str, int]:
    """Names --link accepts on this run's topology: a link's name delays both directions, an end's interface
    its own egress only."""
    out: dict[str, int] = {}
    for ln in spec.get("links") or []:
        if ln.get("name"):
            out[ln["name"]] = 2
        for end in ("a", "b"):
            if (ln.get(end) or {}).get("ifname"):
                out[ln[end]["ifname"]] = 1
    return out


@dataclass(frozen=True)
class Scenario:
    without: tuple[str, ...] = ()
    link_us: dict = field(default_factory=dict)       # name -> extra µs per transaction
    pg_set: dict = field(default_factory=dict)

    def label(self) -> str:
        parts = [f"without {h}" for h in self.without]
        parts += [f"{n} +{us:g} µs/txn" for n, us in self.link_us.items()]
        parts += [f"{k}={v}" for k, v in self.pg_set.items()]
        return ", ".join(parts) or "as recorded"


LINK_RE = re.compile(r"^(?P<name>[^:]+):(?P<key>delay_us|rtt_us)=(?P<val>[0-9.]+)$")


def parse_link(text: str, base: Base) -> tuple[str, float]:
    """NAME:delay_us=N|rtt_us=N -> (name, extra µs per transaction)."""
    m = LINK_RE.match(text.strip())
    if not m:
        raise UserError(f"--link '{text}' is not NAME:delay_us=N or NAME:rtt_us=N (e.g. wire:rtt_us=1000)")
    name, key, val = m["name"], m["key"], float(m["val"])
    if name not in base.links:
        known = ", ".join(sorted(base.links)) or "none: the path has no veth link"
        raise UserError(f"--link: this run's topology has no link or interface '{name}' (links: {known})")
    directions = base.links[name]
    if key == "rtt_us":
        if directions != 2:
            raise UserError(f"--link {name}: rtt_us needs a link's name (both directions), not one interface")
        per_txn = val * base.round_trips
    else:
        per_txn = val * directions * base.round_trips
    return name, per_txn


def parse_pg_set(items: list[str], base: Base, summary: dict) -> dict[str, str]:
    """--pg-set KEY=VALUE: only settings whose effect the model represents (removing the commit's WAL flush)."""
    out = {}
    for item in items or []:
        k, sep, v = item.partition("=")
        k, v = k.strip(), v.strip()
        if not sep or not k:
            raise UserError(f"--pg-set '{item}' is not KEY=VALUE")
        if v.lower() not in WAL_SETTINGS.get(k, ()):
            raise UserError(f"--pg-set {k}={v}: the model cannot predict this setting; it represents only "
                            "settings that take the WAL flush out of a commit (synchronous_commit=off, fsync=off)")
        if not any(s["name"] == "backend.wal_flush" and s.get("part") for s in summary.get("stages") or []):
            raise UserError(f"--pg-set {k}={v} needs the run's backend.wal_flush: record the run with --probes deep")
        out[k] = v
    return out


def apply(b: Base, sc: Scenario) -> Base:
    """The base system changed by a scenario: hops removed, link delays added, the WAL flush taken out."""
    cpu, delays, notes = dict(b.cpu), dict(b.delays), list(b.notes)
    hops, receivers, idle, hop_us = list(b.hops), b.receivers, b.idle_us, dict(b.hop_us)
    for h in sc.without:
        if h not in hops:
            raise UserError(f"--without {h}: this run has no probed hop '{h}' (hops: {', '.join(b.hops) or 'none'})")
        conns = len(hops) + 1
        for k in [k for k in cpu if k.startswith(f"hop.{h}.")]:
            del cpu[k]
        # its second connection's kernel work: every message crossed `conns` connections, now one fewer
        for k in ("softirq.net", "netfilter"):
            if k in cpu:
                cpu[k] *= (conns - 1) / conns
        hops.remove(h)
        hop_us.pop(h, None)
        idle *= max(receivers - 2, 1) / receivers       # its two wakeups per transaction (request and response)
        receivers = max(receivers - 2, 1)
    think = b.think_us + sum(sc.link_us.values())
    for n, us in sc.link_us.items():
        delays[f"added delay on {n}"] = us
    if sc.link_us:
        notes.append("an added delay is a pure delay, as a longer real wire is; pathprof's own delay line (`run "
                     "--link`: an NFQUEUE daemon) also costs CPU per packet (`other`), so a real run with it on a "
                     "CPU-bound path measures less than this")
    wal = 0.0 if sc.pg_set else b.wal_us
    # without the flush at commit, the row lock is released that much sooner
    lock = max(b.lock_us - b.lock_holds_wal, 0.0) if sc.pg_set else b.lock_us
    return replace(b, cpu=cpu, hops=hops, hop_us=hop_us, receivers=receivers, idle_us=idle, think_us=think,
                   delays=delays, notes=notes, wal_us=wal, lock_us=lock)
