"""`pathprof attach`: profile the traffic already flowing to a local PostgreSQL server, with no pgbench.

The target (a port, a server pid or a DSN) is resolved to a path (pathprof.agent.discovery.chain): the server, the
hops in front of it and the clients connected now. The probes follow all of them, always on, for --duration;
a transaction is one request/response exchange on a client connection (a ReadyForQuery-to-ReadyForQuery
cycle: the backend consumes a request and answers it), counted by the probes themselves, so TPS and the
per-transaction tables need no pgbench. Only reading: no namespace, rule, process or setting is created or
changed on the user's system; the BPF programs and links go away with the session.
"""
from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from pathprof.agent.postgres.conninfo import redact
from pathprof.agent.run import start_at
from pathprof.agent.run.observed import observed_result
from pathprof.agent.run.observed import watch as _watch
from pathprof.agent.run.options import Reporter
from pathprof.agent.run.outcome import recording
from pathprof.agent.run.pipeline import DiscoveredSource, LiveFeed, Measurement, record_head
from pathprof.agent.run.signals import sigterm_as_interrupt
from pathprof.analysis.rundir import RunDir
from pathprof.errors import UserError


@dataclass
class AttachOptions:
    port: int | None = None
    server_pid: int | None = None
    dsn: str | None = None
    duration_s: float = 10.0
    probes: str = "basic"
    trace_sample: int = 0
    runs_dir: Path = Path("runs")
    netns: str | None = None        # this namespace alone, as if it were the machine (one agent per "host")
    remote: str | None = None       # ADDR:PORT of a server on another machine: profile this host's clients of it
    host_name: str | None = None    # the host's name in merged runs (default: the namespace's, else hostname)
    status_every_s: float = 10.0    # <run dir>/status.json rewritten this often while attached (0: never)
    start_at: float | None = None   # wall-clock (epoch s) to begin the interval at: hosts' agents aligned


def resolve(opts: AttachOptions):
    """(SocketTable, DiscoveredPath) of the target, or a UserError saying why it cannot be profiled. A namespace
    without a name (a container's) is referred to through the path's own longest-lived process in it."""
    table, path = _resolve(opts)
    table.anchor_namespaces([*([path.postmaster] if path.postmaster else []), *[h.pid for h in path.hops],
                             *path.clients])
    return table, path


def _resolve(opts: AttachOptions):
    from pathprof.agent.discovery import chain as discovery
    from pathprof.agent.discovery.sockets import SocketTable
    if opts.dsn and opts.netns:
        raise UserError("--dsn cannot be combined with --netns: name the server by --port or --server-pid, or its "
                        "clients' side by --remote")
    if opts.remote:
        from pathprof.agent.discovery import edge
        table = SocketTable.take(opts.netns)
        return table, edge.to_remote(table, edge.parse_addr(opts.remote))
    if opts.dsn:
        table, path = _from_dsn(opts.dsn)
    elif opts.server_pid:
        path, table = discovery.from_server_pid(opts.server_pid, SocketTable.take(opts.netns))
    else:
        path, table = discovery.from_port(opts.port, SocketTable.take(opts.netns))
    check_profilable(path, f"port {opts.port}" if opts.port else (f"pid {opts.server_pid}" if opts.server_pid
                                                                    else "--dsn"))
    return table, path


def check_profilable(path, what: str) -> None:
    """A UserError unless the path reaches its server here, or its last hop here connects onward to a server
    on another machine (that host's agent records the rest), or ends at a virtual machine's device."""
    if path.postmaster is None and not path.onward_remote and not any(h.role == "qemu" for h in path.hops):
        first = path.hops[0] if path.hops else None
        who = f"{first.comm} (pid {first.pid})" if first else "its process"
        raise UserError(f"{what} is answered by {who}, which is not PostgreSQL and has no connection onward to a "
                        "PostgreSQL server" + (f" ({path.unseen[0]})" if path.unseen else ""))
    if not path.client_connections:
        raise UserError(f"no client is connected to {what} now: attach profiles traffic that is already flowing "
                        "(start the load first, or use `pathprof run --dsn` to drive pgbench)")


def _from_dsn(dsn: str):
    """Resolve a DSN through a connection of pathprof's own (the path NAT or a proxy take), then profile the
    entry's clients; refuse a server that is not on this machine."""
    import psycopg
    from pathprof.agent.discovery import chain as discovery
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    host = str(info.get("host") or "")
    if host and not host.startswith("/") and not _is_local(host):
        raise UserError(f"--dsn host {host} is not on this machine: attach can only profile a local server")
    try:
        with psycopg.connect(dsn, connect_timeout=5, autocommit=True) as conn:
            from pathprof.agent.discovery.sockets import SocketTable
            table = SocketTable.take()
            path = discovery.from_client_socket(os.fstat(conn.pgconn.socket).st_ino, table)
    except psycopg.Error as e:
        msg = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise UserError(f"cannot connect with --dsn: {msg}") from None
    if path.hops:
        entry_port = next((int(a.rsplit(":", 1)[1]) for a in path.hops[0].listen if not a.startswith("unix:")), None)
        if entry_port:
            return table, discovery.from_entry(table, path.hops[0].pid, entry_port)
    if path.postmaster:
        p2, t2 = discovery.from_server_pid(path.postmaster)
        return t2, p2
    return table, path


def _is_local(host: str) -> bool:
    """Whether a host name or address is one of this machine's (loopback or an address of ours)."""
    try:
        addrs = {ai[4][0] for ai in socket.getaddrinfo(host, None)}
    except socket.gaierror:
        raise UserError(f"--dsn host {host!r} does not resolve") from None
    out = subprocess.run(["ip", "-o", "addr", "show"], capture_output=True, text=True).stdout
    mine = {line.split()[3].split("/")[0] for line in out.splitlines() if len(line.split()) > 3}
    return all(ipaddress.ip_address(a).is_loopback or a in mine for a in addrs)


def execute_attach(opts: AttachOptions, ui: Reporter) -> RunDir:
    """The pipeline with a discovered path as the source and the traffic already flowing as the load driver."""
    from pathprof.agent.probing import doctor
    if opts.probes == "off":
        raise UserError("attach measures with the probes: --probes off leaves nothing to measure")
    if not 1 <= opts.duration_s <= 24 * 3600:
        raise UserError(f"--duration must be between 1 s and 24 h, not {opts.duration_s:g}")
    start_at.check(opts.start_at)
    capabilities = doctor.require(opts.probes)
    ui.phase("discovering the path")
    source = DiscoveredSource(*resolve(opts))
    table, path = source.table, source.path
    source.announce(ui)
    # the client is whatever program is connected (sysbench, python3, ...): its stages go by its name (#35.4)
    from pathprof.agent.discovery.profiled_path import client_name
    client = client_name(table, path)
    # always on: with no pgbench log there is no outside-the-windows rate to compare against anyway
    probes = source.session(opts.probes, opts.trace_sample, 0.0, 0.0, client)
    rd = RunDir.create(opts.runs_dir, "attach")
    target = _source_text(opts)
    from pathprof.agent.discovery import edge
    scope = edge.scope_doc(table, opts.netns, opts.host_name)
    leaving = LeavingConnections(opts.netns, table, path)
    scope["leaving_connections"] = leaving.doc()
    record_head(rd, {"name": "attach", "source": target, "options": {}, "spec": None},
                {"clients": path.client_connections, "threads": None, "duration_s": opts.duration_s,
                 "mode": None, "script": "observed", "connect": False, "scale": None, "rate": None,
                 "client": client},
                postgres={"owned": False, "pid": path.postmaster}, scope=scope, status="running")
    with recording(rd):
        source.write_topology(rd, f"attach {target}")
        notes: list[str] = []
        presult = _measure(opts, rd, probes, source, ui, leaving, notes)
        rd.update(scope={**scope, "leaving_connections": leaving.doc()})
        _record_observed(opts, rd, presult, capabilities, source, leaving, notes)
    return rd


class LeavingConnections:
    """run.json scope.leaving_connections of an attach: those open at the start and every one seen by a look
    during the interval (every LOOK_EVERY_S), so a connection opened after the start (a client that came later,
    a pooler's new server connection) is joined by `pathprof merge` too, and an agent can be started before the
    load. A look that fails is a note, never the run's failure."""
    LOOK_EVERY_S = 2.0

    def __init__(self, netns: str | None, table, path):
        from pathprof.agent.discovery import edge
        self.netns, self.path, self.error = netns, path, None
        self.seen = {}
        self._add(edge.leaving(table, edge.path_pids(table, path)))
        self.last = time.monotonic()

    def _add(self, conns: list[dict]) -> None:
        for c in conns:
            self.seen.setdefault((c["side"], c["local"], c["remote"]), c)

    def look(self) -> None:
        if time.monotonic() - self.last < self.LOOK_EVERY_S:
            return
        self.last = time.monotonic()
        from pathprof.agent.discovery import edge
        from pathprof.agent.discovery.sockets import SocketTable
        try:
            t = SocketTable.take(self.netns)
            self._add(edge.leaving(t, edge.path_pids(t, self.path)))
        except Exception as e:
            self.error = f"{type(e).__name__}: {e}"

    def doc(self) -> list[dict]:
        return sorted(self.seen.values(), key=lambda c: (c["side"], c["local"], c["remote"]))

    def note(self) -> str | None:
        return (None if self.error is None else f"the connections leaving this host were not looked at again "
                f"during the interval ({self.error}): those opened after the start are not joined by merge")


def _source_text(opts: AttachOptions) -> str:
    """run.json topology.source: the target as the user named it (a DSN without its secrets)."""
    source = (f"--port {opts.port}" if opts.port else f"--server-pid {opts.server_pid}" if opts.server_pid
              else f"--remote {opts.remote}" if opts.remote else f"--dsn {redact(opts.dsn)}")
    return source + (f" --netns {opts.netns}" if opts.netns else "")


def _record_observed(opts: AttachOptions, rd: RunDir, presult, capabilities, source: DiscoveredSource,
                     leaving: LeavingConnections, notes: list) -> None:
    """The observed load driver's results: the probes' tables, the always-on schedule, run.json `observed` and
    `cpu` from the probes alone."""
    from pathprof.agent.run import recorder
    meta = recorder.save_probe_result(rd, presult, capabilities)
    meta.update(level=opts.probes, schedule={"window_s": 0.0, "period_s": 0.0, "duty_pct": 100.0,
                                             "always_on": True}, windows=presult.windows)
    meta["notes"] = list(meta.get("notes") or []) + [
        "attach: a transaction is one request/response exchange on a client connection, counted by the probes "
        "(a multi-statement transaction counts each statement's exchange); the probes were on for the whole "
        "interval, so these figures include their cost"] + source.notes()
    meta["notes"] += notes + [n for n in (clients_left_note(opts, source.path), leaving.note()) if n]
    observed, cpu = observed_result(presult, source.path)
    active, seen = observed.get("active_connections"), source.path.client_connections
    if active is not None and active < seen:
        meta["notes"].append(f"{seen - active} of the {seen} client connections sent no request in the interval "
                             f"(idle, as in an application's pool): the cycle is the time of the {active} that did")
    rd.update(observed=observed, cpu=cpu, probes=meta)


INTERVAL_OVER = "interval over: reading the probes"


def _measure(opts: AttachOptions, rd: RunDir, probes, source: DiscoveredSource, ui: Reporter,
             leaving: LeavingConnections, notes: list):
    """Probes on, always on, for the duration; their result. The probes are closed on every way out."""
    feed = LiveFeed.keeping_status(rd, probes, ui, opts.status_every_s, opts.duration_s)
    try:
        with sigterm_as_interrupt():
            source.attach_probes(probes, ui, opts.probes)
            if opts.start_at is not None:
                probes.prepare_window()      # the window then opens at the moment, not after attaching
            late = start_at.late_note(start_at.wait(opts.start_at, ui))
            if late:
                notes.append(late)
            m = Measurement(probes, ui, opts.duration_s)
            m.open_probes()
            ui.phase(f"attached: {source.path.client_connections} client connections, {opts.duration_s:g} s")
            try:
                _watch(probes, source.path, opts.duration_s, ui, feed, tick=leaving.look,
                       client=probes.config.client)
            finally:
                feed.close()            # a status.json write in flight reads the probes' maps
            ui.phase(INTERVAL_OVER)     # whoever drives the load may stop it now (another host's agents too)
            return m.read()
    finally:
        probes.close()


def clients_left_note(opts: AttachOptions, path) -> str | None:
    """The note on client connections that closed during the interval (a second look at the entry), None when
    none did; when the second look fails, the note says it is unknown rather than guess."""
    try:
        now = _connections_now(opts, path)
    except Exception as e:        # the entry went away, or the tables could not be read: not a count of zero
        return (f"could not look at the client connections again at the end ({type(e).__name__}: {e}): whether "
                "clients left during the interval is unknown; the rate and the cycle check assume they stayed")
    gone = path.client_connections - now
    if gone <= 0:
        return None
    return (f"{gone} of {path.client_connections} client connections closed during the interval: the rate and "
            "the cycle check assume they stayed busy all along")


def _connections_now(opts: AttachOptions, path) -> int:
    """Client connections into the path's entry at the end (a second look, to catch clients that left)."""
    from pathprof.agent.discovery import chain as discovery
    from pathprof.agent.discovery.sockets import SocketTable
    t = SocketTable.take(opts.netns)
    if opts.remote:
        from pathprof.agent.discovery import edge
        return edge.to_remote(t, edge.parse_addr(opts.remote)).client_connections
    entry = path.hops[0].pid if path.hops else path.postmaster
    port = next((int(a.rsplit(":", 1)[1]) for a in (path.hops[0].listen if path.hops else path.postgres_listen)
                 if not a.startswith("unix:")), None)
    return discovery.from_entry(t, entry, port).client_connections
