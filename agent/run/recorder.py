"""Glue between a live run and its run directory: which processes the probes follow, what they recorded,
and the process/socket chain the path turned out to be."""
from __future__ import annotations

import os
import re
import subprocess

from pathprof.agent.host.machine import net_counters
from pathprof.agent.host.netns import netns_argv
from pathprof.analysis.rundir import RunDir


def track_path(probes, pg, services) -> None:
    """Seed the probes with the run's own processes; their children are followed in the kernel, and the
    postmaster's later children are looked at again by the session (ProbeSession.follow_server). pathprof's own
    connections into the path (a pooler's counters) are not the workload's: the probes leave the tracked processes'
    ends of them, and the processes that serve only them (pgpool's counters child and its backend) untracked."""
    own = frozenset(pid for svc in services for pid in getattr(svc, "own_pids", list)())
    for svc in services:
        for fd in getattr(svc, "own_sockets", list)():
            probes.own_connection(fd)
    if pg is not None and pg.pid:
        probes.track(pg.pid, "postmaster", skip=own)
        for child in pg.postmaster_children():
            if child in own:
                continue
            # A pooler's server connections already exist: they are backends, not auxiliary processes.
            kind = aux_kind(child)
            if kind:
                probes.track(child, "pg_aux", aux=kind)
            else:
                probes.track(child, "backend")
        probes.follow_server(pg.pid, child_kind)
    for svc in services:
        role = getattr(svc, "role", "proxy")
        for pid in svc.pids():
            probes.track(pid, role, hop=svc.hop, skip=own)


def down_links(topo) -> list[str]:
    """The path's links (veth/tap ends and bridges) that are administratively or operationally down now."""
    bridge_host = {b.name: b.host for b in topo.bridges}
    ends = []
    for link in topo.links:
        for end in (link.a, link.b):
            if end is not None:
                host = end.host or bridge_host.get(end.bridge)
                ends.append((end.ifname, topo.netns_of(host) if host else None))
    down = []
    for ifname, netns in ends:
        out = subprocess.run(netns_argv(netns, ["ip", "-o", "link", "show", "dev", ifname]), capture_output=True,
                             text=True).stdout
        flags = re.search(r"<([^>]*)>", out)
        if out and (not flags or "UP" not in flags.group(1).split(",") or "state DOWN" in out):
            down.append(f"{ifname}{' in ' + netns if netns else ''}")
    return down


def checkpoints(pg) -> dict | None:
    """The server's checkpoint counters (pg_stat_bgwriter), or None where they cannot be read (a guest)."""
    if pg is None:
        return None
    try:
        (timed, req), = pg.query("select checkpoints_timed, checkpoints_req from pg_stat_bgwriter")
    except Exception:     # a server that went away: the run reports that elsewhere
        return None
    return {"timed": int(timed), "requested": int(req)}


def checkpoints_during(before: dict | None, after: dict | None) -> dict | None:
    """run.json postgres.checkpoints: checkpoints that ran during the measured interval, by kind."""
    if not before or not after:
        return None
    d = {k: after[k] - before[k] for k in ("timed", "requested")}
    return {**d, "during_run": d["timed"] + d["requested"]}


AUX_TITLES = ("checkpointer", "background writer", "walwriter", "autovacuum launcher", "autovacuum worker",
              "logical replication launcher", "archiver", "stats collector", "startup", "walreceiver",
              "walsender", "logger")
# a client backend's title after the prefix: "user database host(port) ..." or "user database [local] ..."
CLIENT_TITLE = re.compile(r"\S+ \S+ (\[local\]|\S+\(\d+\))( |$)")


def _title(pid: int) -> str | None:
    """A server process's title without "postgres: " and the cluster_name prefix ("15/main: " on Debian);
    None when it is not retitled (yet): a child starts with the postmaster's command line."""
    try:
        raw = open(f"/proc/{pid}/cmdline", "rb").read()
    except OSError:
        return None
    title = raw.replace(b"\0", b" ").decode(errors="replace").strip()
    if not title.startswith("postgres: "):
        return None
    title = title.removeprefix("postgres: ")
    head, sep, rest = title.partition(": ")
    if sep and " " not in head:         # cluster_name: one word (a user name has no ": " after it)
        title = rest
    return title


def aux_kind(pid: int) -> str | None:
    """The kind of a PostgreSQL auxiliary process from its title ("postgres: checkpointer "), None for a
    backend (layout.AUX_KINDS names the kinds; the rest of AUX_TITLES are "other")."""
    title = _title(pid)
    if title is None:
        return None if os.path.exists(f"/proc/{pid}") else "other"
    if not title.startswith(AUX_TITLES):
        return None
    for prefix, kind in (("checkpointer", "checkpointer"), ("background writer", "bgwriter"),
                         ("walwriter", "walwriter"), ("autovacuum", "autovacuum"), ("logger", "logger")):
        if title.startswith(prefix):
            return kind
    return "other"


def child_kind(pid: int) -> str:
    """What a process the postmaster forked during the run is: "backend" (a client's), an auxiliary kind
    (a walsender, an autovacuum or background worker: "other" where AUX_KINDS has no name for it), or
    "starting" while it still has the postmaster's title (look again later)."""
    title = _title(pid)
    if title is None:
        return "starting" if os.path.exists(f"/proc/{pid}") else "other"
    kind = aux_kind(pid)
    if kind:
        return kind
    return "backend" if CLIENT_TITLE.match(title) else "other"   # a background worker names itself


def save_probe_result(rd: RunDir, result, capabilities: list | None) -> dict:
    """The probes' tables into the run directory; run.json `probes` keys, with the doctor's capabilities the run
    passed its gate with (doctor.require)."""
    rd.write_frame("stages.parquet", result.stages)
    rd.write_frame("cpu.parquet", result.cpu)
    if getattr(result, "traces", None) is not None and len(result.traces):
        rd.write_frame("traces.parquet", result.traces)
    if getattr(result, "messages", None) is not None and len(result.messages):
        rd.write_frame("messages.parquet", result.messages)
    return {"cost": result.cost, "lost": result.lost, "capabilities": capabilities,
            "notes": getattr(result, "notes", []), "counters": getattr(result, "counters", {}),
            "hooks": getattr(result, "hooks", None)}


def live_sockets(topo) -> dict:
    """Established TCP connections with their processes, per host, grouped by process name."""
    out = {}
    for h in topo.hosts.values():
        conns = _established(h.netns)
        if conns:
            out[h.name] = conns
    return out


def _established(netns: str | None) -> list[dict]:
    argv = netns_argv(netns, ["ss", "-Htnp", "state", "established"])
    out = subprocess.run(argv, capture_output=True, text=True).stdout
    rows = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 4:
            m = re.search(r'users:\(\("([^"]+)",pid=(\d+)', line)
            rows.append({"local": parts[2], "peer": parts[3], "process": m.group(1) if m else None,
                         "pid": int(m.group(2)) if m else None})
    # One entry per (process, local side, peer side) shape is enough to show the chain.
    seen, chain = set(), []
    for r in rows:
        key = (r["process"], r["local"].rsplit(":", 1)[0], r["peer"].rsplit(":", 1)[0])
        if key not in seen:
            seen.add(key)
            chain.append({**r, "connections": sum(1 for x in rows if (x["process"], x["local"].rsplit(":", 1)[0],
                                                                       x["peer"].rsplit(":", 1)[0]) == key)})
    return chain


def discovered_path(topo, ctx, pg, services, seen_sockets: dict | None = None) -> dict:
    """The chain as configured and as seen (processes and sockets), for topology.json."""
    target = topo.client.targets[topo.client.target]
    chain = [{"process": "pgbench", "host": topo.client.host, "netns": topo.netns_of(topo.client.host)},
             {"connects_to": "unix:" + str(pg.socket_dir) if target.unix and pg else f"{target.host}:{target.port}"}]
    for svc in services:
        chain.append({"hop": svc.hop, **svc.describe()})
    chain.append({"process": "postgres", "host": topo.postgres.host, "netns": topo.netns_of(topo.postgres.host),
                  "listen": f"{topo.postgres.listen}:{topo.postgres.port}", "pid": pg.pid if pg else None})
    return {"topology": topo.name, "target": topo.client.target, "chain": chain, "sockets": seen_sockets or {},
            "hosts": {h.name: {"netns": h.netns, "addresses": ctx.hosts[h.name].addresses}
                      for h in topo.hosts.values()}}


TCP_COUNTERS = {"Tcp": ("RetransSegs",), "TcpExt": ("TCPLossProbes", "TCPTimeouts", "TCPFastRetrans",
                                                    "TCPSynRetrans")}


def tcp_counters(topo) -> dict:
    """The kernel's own TCP retransmission counters in each of the topology's namespaces (/proc/net/snmp and
    netstat seen from inside), to check the probes' retransmission counts against: {netns: {name: value}}."""
    out = {}
    for ns in dict.fromkeys(h.netns for h in topo.hosts.values()):
        cp = subprocess.run(netns_argv(ns, ["cat", "/proc/net/snmp", "/proc/net/netstat"]), capture_output=True,
                            text=True)
        out[ns or "root"] = net_counters(cp.stdout, TCP_COUNTERS)
    return out


def tcp_counters_during(before: dict, after: dict) -> dict:
    return {ns: {k: after[ns].get(k, 0) - v for k, v in vals.items()} for ns, vals in before.items() if ns in after}
