"""`pathprof compare` entries that vary anything a run takes: TOPOLOGY[:KEY=VALUE]...

    docker-dnat:userland-proxy=on  docker-dnat:userland-proxy=off     the headline experiment in one command
    unix:clients=16  unix:clients=96                                  client counts
    loopback  loopback:pg-set=fsync=off                               a postgresql.conf setting
    pgbouncer:option=pool_mode=transaction:mode=simple                several settings at once
    nic  nic:link=wire:delay_us=250                                   the same path with and without a delay

A KEY is any `pathprof run` option without its dashes (clients, threads, duration, mode, script, connect, scale,
rate, pg-set, userland-proxy, target, option, probes, probe-duty, ...); VALUE is what that option takes (a flag
such as connect takes on/off). The entry as written is the run's label in tables and JSON. After `link=NAME`,
impairment keys (delay_us=, jitter_us=, loss_pct=, rate_mbit=, rtt_us=) belong to that --link (the ':' of
`--link NAME:KEY=VALUE` works here too, as does `link=NAME,KEY=VALUE,...`).
"""
from __future__ import annotations

import argparse
import copy
from dataclasses import dataclass

from pathprof.errors import UserError

_ON, _OFF = {"on", "true", "yes", "1"}, {"off", "false", "no", "0"}


@dataclass
class Variant:
    text: str                 # as written: the label
    topology: str
    settings: list[tuple[str, str]]

    @property
    def label(self) -> str:
        return self.text


def parse_variant(text: str) -> Variant:
    topology, *pairs = text.split(":")
    if not topology:
        raise UserError(f"compare entry '{text}': no topology before the first ':'")
    from pathprof.topologies.impairments import KEYS, SHARED_ONLY
    settings = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UserError(f"compare entry '{text}': '{pair}' is not KEY=VALUE (e.g. {topology}:clients=16)")
        if key.strip() in KEYS + SHARED_ONLY and settings and settings[-1][0] == "link":
            settings[-1] = ("link", f"{settings[-1][1]},{pair}")     # link=wire:delay_us=250: one --link
            continue
        settings.append((key.strip().lstrip("-"), value))
    return Variant(text, topology, settings)


class _VariantParser(argparse.ArgumentParser):
    def error(self, message: str):
        raise UserError(message)


def _parser() -> argparse.ArgumentParser:
    from pathprof.agent.cli.args import add_workload_options
    p = _VariantParser(prog="variant", add_help=False)
    add_workload_options(p, clients_default=0)
    for act in p._actions:            # only what the entry sets lands on the compare command's options
        act.default = argparse.SUPPRESS
    return p


def apply(a: argparse.Namespace, variant: Variant) -> tuple[argparse.Namespace, dict[str, str]]:
    """A copy of the compare command's options with the variant's settings on top (validated by the same rules
    as `pathprof run`'s flags), and the topology options the variant itself set."""
    p = _parser()
    flags = {opt.lstrip("-"): act for act in p._actions for opt in act.option_strings if opt.startswith("--")}
    argv = []
    for key, value in variant.settings:
        act = flags.get(key)
        if act is None:
            known = ", ".join(sorted(k for k in flags if k not in ("json", "no-live", "runs-dir")))
            raise UserError(f"compare entry '{variant.text}': unknown setting '{key}' (one of {known})")
        if act.nargs == 0:        # a flag: on/off
            if value.lower() not in _ON | _OFF:
                raise UserError(f"compare entry '{variant.text}': {key} takes on or off, not '{value}'")
            if value.lower() in _ON:
                argv.append(f"--{key}")
            continue
        argv += [f"--{key}", value]
    ns = copy.deepcopy(a)
    for key, value in variant.settings:
        act = flags[key]
        if act.nargs == 0 and value.lower() in _OFF:
            setattr(ns, act.dest, False)
    try:
        p.parse_args(argv, namespace=ns)
    except UserError as e:
        raise UserError(f"compare entry '{variant.text}': {e}") from None
    mine = argparse.Namespace(option=[], userland_proxy=None, target=None)
    p.parse_args(argv, namespace=mine)        # the entry's own topology options, apart
    from pathprof.agent.cli.args import topo_options
    return ns, topo_options(mine)
