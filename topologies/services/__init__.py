"""Services: the processes a topology puts on the path (each one a hop in reports).

One class per `[[services]] kind`; `create(spec_service)` returns an unstarted instance. The run starts them in
spec order after PostgreSQL is up (`start(ctx)` returns only when the service is ready, within a bounded time)
and stops them in reverse before the journal replays. Options are declared per class (`OPTIONS`), so a spec is
checked when it is parsed and a bad key is named with the file it came from.

Service modules import only the standard library and `pathprof.agent.host.proc` at import time: `spec.py` calls
`option_problems()` while parsing, and must not drag pyroute2 in with it.
"""
from __future__ import annotations

import importlib
import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pathprof.agent.host import proc
from pathprof.agent.host.netns import in_netns
from pathprof.errors import UserError

if TYPE_CHECKING:  # pragma: no cover
    from pathprof.topologies.builder import BuildContext
    from pathprof.topologies.spec import Service as SpecService
    from pathprof.topologies.spec import Topology

# kind -> "module:Class"; modules are imported only when a service of that kind is created.
KINDS = {
    "docker-proxy": "docker_proxy:DockerProxy",
    "pgbouncer": "pgbouncer:PgBouncer",
    "pgpool": "pgpool:PgPool",
    "command": "command:Command",
    "qemu-guest": "qemu_guest:QemuGuest",
}

REQUIRED = object()


@dataclass(frozen=True)
class Opt:
    """One service option: accepted Python type(s) (as TOML gives them), default, allowed values."""
    types: type | tuple
    default: Any = REQUIRED
    choices: tuple = ()
    help: str = ""


def _class(kind: str):
    if kind not in KINDS:
        raise UserError(f"unknown service kind '{kind}' (known: {', '.join(sorted(KINDS))})")
    module, cls = KINDS[kind].split(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)


def option_type(kind: str, key: str):
    """The type a service of `kind` wants for option `key` (None for an unknown key)."""
    opt = _class(kind).OPTIONS.get(key)
    return opt.types if opt else None


def option_problems(kind: str, options: dict) -> list[tuple[str, str]]:
    """(key, problem) for every bad option of a service of `kind`; empty when all is well."""
    table = _class(kind).OPTIONS
    problems = []
    for key, value in options.items():
        if key not in table:
            problems.append((key, f"unknown option for a {kind} service (its options: {', '.join(sorted(table))})"))
            continue
        opt = table[key]
        if not isinstance(value, opt.types) or (isinstance(value, bool) and opt.types is int):
            want = opt.types.__name__ if isinstance(opt.types, type) else " or ".join(t.__name__ for t in opt.types)
            problems.append((key, f"must be {want}, not {type(value).__name__}"))
        elif opt.choices and value not in opt.choices:
            problems.append((key, f"'{value}' is not one of {', '.join(map(str, opt.choices))}"))
        elif isinstance(value, list) and not all(isinstance(v, str) for v in value):
            problems.append((key, "must be a list of strings"))
    for key, opt in table.items():
        if opt.default is REQUIRED and key not in options:
            problems.append((key, f"is required for a {kind} service" + (f" ({opt.help})" if opt.help else "")))
    return problems


def create(spec_service: "SpecService") -> "Service":
    """An unstarted Service for one `[[services]]` entry; UserError naming the key for a bad option."""
    cls = _class(spec_service.kind)
    for key, problem in option_problems(spec_service.kind, spec_service.options):
        raise UserError(f"service '{spec_service.name}' ({spec_service.kind}): option {key}: {problem}")
    return cls(spec_service)


def check_workload(topology: "Topology", mode: str, connect: bool) -> None:
    """Refuse, before anything is built, a pgbench workload one of the topology's services cannot carry."""
    for s in topology.services:
        create(s).check_workload(mode, connect)   # clients: checked where they are known (agent.run.owned)


class Service:
    """Base of every hop process; subclasses set `kind`, `OPTIONS` and implement `start`."""
    kind = ""
    OPTIONS: dict[str, Opt] = {}
    stop_signal = 15          # SIGTERM; subclasses use what their real supervisor uses
    role = "other"            # probe role for the hop's processes (pooler, proxy, qemu, other)

    def __init__(self, spec_service: "SpecService"):
        self.spec = spec_service
        self.hop = spec_service.name
        self.host = spec_service.host
        self.opts = {k: spec_service.options.get(k, o.default) for k, o in self.OPTIONS.items()}
        self.popen: subprocess.Popen | None = None
        self.netns: str | None = None
        self.log_path: Path | None = None

    # -- the contract (docs/INTERNALS.md) --
    def check_workload(self, mode: str, connect: bool, clients: int = 1, threads: int | None = None) -> None:
        """Raise UserError if pgbench `mode` (simple|extended|prepared) / `connect` (-C) / `clients` on `threads`
        cannot work here."""

    def start(self, ctx: "BuildContext") -> None:
        raise NotImplementedError

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            proc.stop_process(self.popen, sig=self.stop_signal)
        self.popen = None

    def pids(self) -> list[int]:
        if self.popen is None or self.popen.poll() is not None:
            return []
        return [self.popen.pid]

    def counters(self) -> dict | None:
        """The hop's own view of its queue, sampled while pgbench runs (a pooler's waiting clients), to check
        the probes' stages against; None when the hop keeps no such counters."""
        return None

    counters_source = ""      # what counters() reads, for the record
    servers_are = "server connection"   # what a client of this hop waits for, in the report's words
    busy_is = "active"                  # what counts as busy in counters()' servers_busy

    def final_counters(self) -> dict | None:
        """The hop's own tables once pgbench has finished (kept whole in run.json); None when it keeps none."""
        return None

    def own_sockets(self) -> list[int]:
        """pathprof's own TCP connections into this hop, open now (the counters connection in `_admin`): the
        probes leave them (agent/probing/own_conns.py)."""
        admin = getattr(self, "_admin", None)
        return [admin.pgconn.socket] if admin is not None else []

    def own_pids(self) -> list[int]:
        """Processes on the path that serve only pathprof's own connections (pgpool's counters child and its
        backend): never tracked."""
        return []

    def close_counters(self) -> None:
        """Release whatever counters() holds open: the admin console connection a pooler keeps in `_admin`."""
        if getattr(self, "_admin", None) is not None:
            try:
                self._admin.close()
            finally:
                self._admin = None

    def describe(self) -> dict:
        return {"kind": self.kind, "hop": self.hop, "host": self.host, "netns": self.netns, "role": self.role,
                "pids": self.pids(), "options": dict(self.opts),
                "log": str(self.log_path) if self.log_path else None}

    # -- helpers for subclasses --
    def tcp_postgres(self, ctx: "BuildContext"):
        """The owned server's endpoint, which a pooler reaches over TCP (a unix-only server cannot be pooled)."""
        pg = ctx.postgres
        if pg is None or pg.address is None:
            raise UserError(f"{self.hop}: {self.kind} needs the owned PostgreSQL on TCP (the spec's [postgres] "
                            "listen must be an address, not unix)")
        return pg

    @staticmethod
    def clients(ctx: "BuildContext") -> int:
        return max(int(getattr(ctx, "clients", 1) or 1), 1)

    def workdir(self, ctx: "BuildContext", owner: str | None = None) -> Path:
        """ctx.state_dir/<hop>, owned by `owner` when the service drops privileges (it writes pid/sockets)."""
        d = Path(ctx.state_dir) / self.hop
        d.mkdir(parents=True, exist_ok=True)
        if owner:
            import pwd
            pw = pwd.getpwnam(owner)
            os.chown(d, pw.pw_uid, pw.pw_gid)
            # the service user must be able to traverse state_dir to reach its own directory
            d.parent.chmod(d.parent.stat().st_mode | 0o011)
        self.log_path = d / f"{self.kind}.log"
        return d

    def spawn(self, ctx: "BuildContext", argv: list[str], user: str | None = None, **kw) -> subprocess.Popen:
        """Start in the service's host namespace, journaled. A user is dropped to with setpriv, which execs
        (runuser would fork and leave itself as the pid we track)."""
        self.netns = ctx.host(self.host).netns
        if user:
            argv = [proc.which("setpriv"), f"--reuid={user}", f"--regid={user}", "--init-groups", "--", *argv]
        self.popen = ctx.spawn(self.host, argv, log_path=self.log_path, **kw)
        return self.popen

    def fail(self, what: str) -> UserError:
        """A UserError carrying the tail of the service's log, after stopping it."""
        tail = log_tail(self.log_path)
        self.stop()
        return UserError(f"{self.hop} ({self.kind}): {what}"
                         + (f"; its log ({self.log_path}) ends: {tail}" if tail else ""))

    def wait_sql(self, ctx: "BuildContext", address: str, port: int, timeout_s: float = 30.0) -> None:
        """Ready = a real `select 1` through the service from its own host (not just an open port)."""
        deadline = time.monotonic() + timeout_s
        last = ""
        while time.monotonic() < deadline:
            if self.popen is not None and self.popen.poll() is not None:
                raise self.fail(f"exited with status {self.popen.returncode} while starting")
            ok, last = sql_ping(ctx.host(self.host).netns, address, port)
            if ok:
                return
            time.sleep(0.05)        # a pooler is up within tens of ms: a coarse poll would only add waiting
        raise self.fail(f"no `select 1` through {address}:{port} within {timeout_s:.0f} s (last error: {last})")


def log_tail(path: Path | None, lines: int = 4) -> str:
    try:
        text = Path(path).read_text(errors="replace").strip().splitlines() if path else []
    except OSError:
        return ""
    return " | ".join(text[-lines:])


def psql() -> str:
    p = proc.PG_BINDIR / "psql"
    return str(p) if p.exists() else proc.which("psql")


def sql_ping(netns: str | None, address: str, port: int, user: str = "postgres", dbname: str = "postgres"
             ) -> tuple[bool, str]:
    """One `select 1` from inside `netns`; (ok, error text)."""
    conninfo = f"host={address} port={port} user={user} dbname={dbname} connect_timeout=3"
    cp = proc.run(netns, [psql(), "-X", "-At", "-d", conninfo, "-c", "select 1"], check=False, timeout=10)
    if cp.returncode == 0 and cp.stdout.strip() == "1":
        return True, ""
    lines = (cp.stderr or cp.stdout or "").strip().splitlines()
    return False, lines[-1] if lines else f"psql exit {cp.returncode}"


def tcp_open(netns: str | None, address: str, port: int, timeout_s: float = 1.0) -> bool:
    """Can a TCP connection to address:port be opened from inside `netns`? (pathprof.agent.host.netns: a thread
    enters the namespace, so no process is forked per probe.)"""
    def probe():
        with socket.create_connection((address, port), timeout=timeout_s):
            return True
    try:
        return bool(in_netns(netns, probe, timeout_s + 1))
    except (OSError, TimeoutError):
        return False
