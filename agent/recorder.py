"""Glue between a live run and its run directory: which processes the probes follow, what they recorded,
and the process/socket chain the path turned out to be."""
from __future__ import annotations

import re
import subprocess

from pathprof.agent.netns import netns_argv
from pathprof.analysis.rundir import RunDir


def track_path(probes, pg, services) -> None:
    """Seed the probes with the run's own processes; their children are followed in the kernel."""
    if pg is not None and pg.pid:
        probes.track(pg.pid, "postmaster")
        for child in pg.postmaster_children():
            # A pooler's server connections already exist: they are backends, not auxiliary processes.
            probes.track(child, "pg_aux" if is_aux_process(child) else "backend")
    for svc in services:
        role = getattr(svc, "role", "proxy")
        for pid in svc.pids():
            probes.track(pid, role, hop=svc.hop)


AUX_TITLES = ("checkpointer", "background writer", "walwriter", "autovacuum launcher", "autovacuum worker",
              "logical replication launcher", "archiver", "stats collector", "startup", "walreceiver",
              "walsender", "logger")


def is_aux_process(pid: int) -> bool:
    """Postgres auxiliary process, from its process title ("postgres: checkpointer ")."""
    try:
        title = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return True
    title = title.removeprefix("postgres: ").strip()
    return title.startswith(AUX_TITLES)


def save_probe_result(rd: RunDir, result) -> dict:
    rd.write_frame("stages.parquet", result.stages)
    rd.write_frame("cpu.parquet", result.cpu)
    if getattr(result, "traces", None) is not None and len(result.traces):
        rd.write_frame("traces.parquet", result.traces)
    return {"cost": result.cost, "lost": result.lost, "capabilities": getattr(result, "capabilities", None),
            "notes": getattr(result, "notes", [])}


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
