"""What-if scenarios for analysis.predict: a hop removed, a link's delay added, the commit's WAL flush taken out.

Pure functions over a model base (analysis.predict.Base): parse the user's words, refuse what the run cannot
support, and return the changed base.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from pathprof.analysis.run_model import Summary
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
    wal_unthrottled: bool = False                      # the WAL device without its --wal-device-limit

    def label(self) -> str:
        parts = [f"without {h}" for h in self.without]
        parts += [f"{n} +{us:g} µs/txn" for n, us in self.link_us.items()]
        parts += [f"{k}={v}" for k, v in self.pg_set.items()]
        parts += ["WAL device unthrottled"] if self.wal_unthrottled else []
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


def parse_pg_set(items: list[str], base: Base, summary: dict | Summary) -> dict[str, str]:
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
        if not any(s.name == "backend.wal_flush" and s.part for s in Summary.of(summary).stages):
            raise UserError(f"--pg-set {k}={v} needs the run's backend.wal_flush: record the run with --probes deep")
        out[k] = v
    return out


def parse_wal_limit(text: str | None, base: Base) -> bool:
    """--wal-device-limit none: the run's throttled WAL device without its throttle (True), refused when the run
    cannot show what the device itself takes."""
    if text is None:
        return False
    if text.strip().lower() != "none":
        raise UserError(f"--wal-device-limit {text}: the model predicts only 'none' (the WAL device without its "
                        "throttle); a different limit's queue is not something the run measured")
    dev = base.wal_device or {}
    if not dev.get("limit"):
        raise UserError("--wal-device-limit none needs a run whose WAL was on a throttled device (run --wal-device MB "
                        "--wal-device-limit ...)")
    if not base.wal_us:
        raise UserError("--wal-device-limit none needs the run's backend.wal_flush: record the run with --probes deep")
    if dev.get("device_us") is None:
        raise UserError(f"--wal-device-limit none: the run's disk view has no time on the WAL device "
                        f"{dev.get('device')}: the device's own time is what the WAL flush would take unthrottled")
    return True


def _wal_and_lock(b: Base, sc: Scenario) -> tuple[float, float, list[str]]:
    """The commit's WAL flush and a row lock's hold time under the scenario: the flush goes (a WAL setting) or
    shrinks to the device's own time (the throttle's queue goes); a row lock is held that much less."""
    if sc.pg_set:
        return 0.0, max(b.lock_us - b.lock_holds_wal, 0.0), []
    if not sc.wal_unthrottled or not b.wal_us:
        return b.wal_us, b.lock_us, []
    fast = min(float(b.wal_device["device_us"]), b.wal_us)
    # the commit's flush is inside the lock's hold: the hold loses what the flush loses, at most the flush's
    # share of the hold measured in the windows (what a WAL setting that removes the flush takes off it)
    lock = max(b.lock_us - min(b.wal_us - fast, b.lock_holds_wal), 0.0)
    return fast, lock, [f"WAL device unthrottled: the commit's WAL flush becomes the device's own time (the disk "
                        f"view on {b.wal_device.get('device')}: {fast:.1f} µs per transaction, from "
                        f"{b.wal_us:.1f} with the throttle's queue)"]


def _delay_lines(b: Base, sc: Scenario, cpu: dict, notes: list) -> dict:
    """An added link delay is what pathprof builds for it (`run --link`): one delay line (an NFQUEUE daemon, one
    thread) per delayed direction, which costs CPU per packet: the machine's cost per packet and packets per round
    trip (agent.host.machine_costs) price it; without them the delay is pure, as a longer real wire is."""
    from pathprof.analysis.predict_inputs import machine_value
    if not sc.link_us:
        return dict(b.delaylines)
    per_packet, src = machine_value(b.machine, "delayline_cpu_us_per_packet")
    per_rt, _ = machine_value(b.machine, "delayline_packets_per_round_trip_each")
    if b.delays.get("link delay lines and rate limits"):
        notes.append("the run already had delay lines: an added delay is priced as pure (their CPU is already in "
                     "the run)")
        return dict(b.delaylines)
    if not (per_packet and per_rt):
        notes.append("an added delay is a pure delay, as a longer real wire is; pathprof's own delay line (`run "
                     "--link`: an NFQUEUE daemon) also costs CPU per packet, unknown on this machine (no run with a "
                     "delay line yet), so a real run with it on a CPU-bound path measures less than this")
        return dict(b.delaylines)
    out = dict(b.delaylines)
    for n in sc.link_us:
        lines = b.links.get(n, 1)                # a link's name delays both directions, an interface one
        us = per_packet * per_rt * b.round_trips * lines
        cpu["delayline"] = cpu.get("delayline", 0.0) + us
        out[n] = (lines, us)
        notes.append(f"an added delay on {n} is what `pathprof run --link` builds: {lines} delay line(s) (NFQUEUE "
                     f"daemons, one thread each), {per_packet:.1f} µs CPU per packet x {per_rt:.2f} packets per round "
                     f"trip each = {us:.1f} µs per transaction, {src}; a real wire would not cost it")
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
    band, band_parts = b.band_pct, dict(b.band_parts)
    if sc.without:
        band, band_parts = _rest_without_hops(b, tuple(sc.without), cpu, notes, band, band_parts)
    think = b.think_us + sum(sc.link_us.values())
    for n, us in sc.link_us.items():
        delays[f"added delay on {n}"] = us
    delaylines = _delay_lines(b, sc, cpu, notes)
    # a delay line works on a packet while it holds it: at low load its CPU is inside the added delay; only
    # under load, where it takes CPUs from the path, does it cost the cycle (through the CPUs' queue)
    think -= sum(min(us, sc.link_us[n]) for n, (_, us) in delaylines.items() if n in sc.link_us
                 and n not in b.delaylines)
    # without the flush at commit (or with a faster one), the row lock is released that much sooner
    wal, lock, wal_notes = _wal_and_lock(b, sc)
    notes += wal_notes
    return replace(b, cpu=cpu, hops=hops, delaylines=delaylines, hop_us=hop_us, receivers=receivers, idle_us=idle,
                   think_us=think, delays=delays, notes=notes, wal_us=wal, lock_us=lock, band_pct=band,
                   band_parts=band_parts)


def _rest_without_hops(b: Base, gone: tuple[str, ...], cpu: dict, notes: list, band: float,
                       band_parts: dict) -> tuple[float, dict]:
    """The rest of the path runs its own work cheaper without a hop, by the ratio this machine measured in pairs
    of runs (analysis.hop_removal); the ratio's spread over those pairs widens the band. (cpu, notes: in place.)"""
    import math

    from pathprof.analysis import hop_removal
    f, spread, src = hop_removal.factor(b.machine, gone)
    if f is None:
        notes.append("without the hop, the rest of the path is priced at the CPU it had beside it; on a machine "
                     "where a pair of runs with and without a hop was measured it ran its own work 0.69-0.77x as "
                     "dear (a 2-CPU VM): `pathprof compare PATH PATH:target=...` (or `:userland-proxy=off`) teaches "
                     "this machine its ratio; until then this TPS is likely low")
        return band, band_parts
    for k in cpu:
        cpu[k] *= f
    notes.append(f"without the hop, the rest of the path's CPU per transaction x {f:.2f} ({src}; spread "
                 f"±{spread:.1f} %): its own work runs cheaper with fewer processes interleaved on the CPUs")
    band_parts = {**band_parts, "hop_removal_ratio_pct": round(spread, 1)}
    return round(math.sqrt(band ** 2 + spread ** 2), 1), band_parts
