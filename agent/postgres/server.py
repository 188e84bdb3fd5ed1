"""The owned PostgreSQL: initdb'ed under the run's state directory, started inside the topology's server host."""
from __future__ import annotations

import os
import pwd
import re
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pathprof.agent.host import proc
from pathprof.agent.host.journal import Journal
from pathprof.errors import RequirementError, UserError

if TYPE_CHECKING:
    from pathprof.agent.postgres.template import PreparedCluster

PG_USER = "postgres"
# --no-sync: the cluster is thrown away after the run, so durability of initdb's files does not matter.
INITDB_OPTIONS = ["-U", PG_USER, "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C"]
HBA_LINES = ["host all all 198.18.0.0/15 trust"]
SETTING_RE = re.compile(r"^[a-z_][a-z0-9_.]*$")


def parse_pg_set(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not SETTING_RE.match(key) or value == "":
            raise UserError(f"--pg-set '{item}' is not KEY=VALUE (e.g. --pg-set shared_buffers=256MB)")
        out[key] = value.strip()
    return out


def warm_template() -> Path:
    """Build the cached template now (a machine image's build: its first run then copies instead of initdb)."""
    from pathprof.agent.postgres import template
    pw = pwd.getpwnam(PG_USER)
    return template.ensure(INITDB_OPTIONS, HBA_LINES, PG_USER, pw.pw_uid, pw.pw_gid)[0]


def prepare_cluster(pg_state_dir: Path) -> "PreparedCluster | None":
    """Start copying a cached initdb'ed template to what will be ManagedPostgres(pg_state_dir).data_dir, in the
    background; None when caching is off (PATHPROF_PG_CACHE=off), and initdb() then runs initdb itself."""
    if os.environ.get("PATHPROF_PG_CACHE") == "off":
        return None
    from pathprof.agent.postgres.template import PreparedCluster
    try:
        pw = pwd.getpwnam(PG_USER)
    except KeyError:
        return None                 # initdb() says what is missing
    pg_state_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
    return PreparedCluster(pg_state_dir / "pgdata", INITDB_OPTIONS, HBA_LINES, PG_USER, pw.pw_uid, pw.pw_gid)


@dataclass
class ManagedPostgres:
    state_dir: Path
    netns: str | None
    listen: str                 # an address, or "unix"
    port: int
    settings: dict[str, str] = field(default_factory=dict)
    max_connections: int = 100
    journal: Journal | None = None

    def __post_init__(self):
        self.data_dir = self.state_dir / "pgdata"
        self.socket_dir = self.state_dir / "sock"
        self.log_path = self.state_dir / "postgres.log"
        self.process = None
        self.wal_device = None      # agent.host.storage.WalDevice when the WAL has a device of its own
        self.template = None        # {"key", "reused"} when the cluster was copied from a cached template

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def _uid(self) -> tuple[int, int]:
        try:
            pw = pwd.getpwnam(PG_USER)
        except KeyError:
            raise RequirementError("no 'postgres' system user; install the Debian package postgresql-15") from None
        return pw.pw_uid, pw.pw_gid

    def initdb(self, waldir: Path | None = None, prepared: "PreparedCluster | None" = None) -> None:
        """The cluster: from the prepared template copy when there is one, else a fresh initdb."""
        initdb = proc.which("initdb")
        uid, gid = self._uid()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.state_dir, 0o755)
        self.socket_dir.mkdir(mode=0o700, exist_ok=True)
        os.chown(self.socket_dir, uid, gid)
        self.log_path.touch()
        os.chown(self.log_path, uid, gid)
        if prepared is not None:
            from pathprof.agent.postgres.template import move_wal
            self.template = prepared.wait()
            if waldir:
                move_wal(self.data_dir, waldir)
            return
        self.data_dir.mkdir(mode=0o700, exist_ok=True)
        os.chown(self.data_dir, uid, gid)
        proc.run(None, [initdb, "-D", str(self.data_dir), *INITDB_OPTIONS,
                        *(["--waldir", str(waldir)] if waldir else [])], user=PG_USER, timeout=120)
        with open(self.data_dir / "pg_hba.conf", "a") as f:
            f.writelines(line + "\n" for line in HBA_LINES)

    def argv(self) -> list[str]:
        listen = "" if self.listen == "unix" else self.listen
        conf = {"listen_addresses": listen, "port": str(self.port), "unix_socket_directories": str(self.socket_dir),
                "max_connections": str(self.max_connections), "logging_collector": "off"}
        conf.update(self.settings)
        argv = [proc.which("postgres"), "-D", str(self.data_dir)]
        for k, v in conf.items():
            argv += ["-c", f"{k}={v}"]
        return argv

    def start(self, timeout: float = 30.0) -> None:
        argv = self.argv()
        if self.journal:
            self.process = self.journal.spawn(self.netns, argv, user=PG_USER, log_path=self.log_path)
        else:
            self.process = proc.spawn(self.netns, argv, user=PG_USER, log_path=self.log_path)
        self.wait_ready(timeout)

    def log_tail(self, n: int = 4) -> str:
        try:
            lines = [ln for ln in self.log_path.read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return ""
        return " | ".join(lines[-n:])

    def conninfo(self, dbname: str = "postgres") -> str:
        return f"host={self.socket_dir} port={self.port} user={PG_USER} dbname={dbname} connect_timeout=5"

    def wait_ready(self, timeout: float) -> None:
        import psycopg
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise UserError(f"postgres exited during start-up (exit {self.process.returncode}): {self.log_tail()}")
            try:
                with psycopg.connect(self.conninfo(), autocommit=True) as conn:
                    conn.execute("select 1")
                    return
            except psycopg.OperationalError as e:
                last = e
                time.sleep(0.02)        # start-up takes ~0.1 s: a coarse poll would add half its period
        raise UserError(f"postgres did not accept connections within {timeout:.0f} s: {last}; {self.log_tail()}")

    def query(self, sql: str, params=None) -> list[tuple]:
        import psycopg
        with psycopg.connect(self.conninfo(), autocommit=True) as conn:
            return conn.execute(sql, params).fetchall()

    def describe(self) -> dict:
        version = self.query("show server_version")[0][0]
        changed = self.query("select name, current_setting(name) from pg_settings where source not in "
                             "('default', 'override') order by name")
        return {"owned": True, "version": version, "pid": self.pid, "port": self.port, "listen": self.listen,
                "settings": {n: s for n, s in changed},
                "wal_device": self.wal_device.describe() if self.wal_device else None, "template": self.template}

    def postmaster_children(self) -> list[int]:
        """Auxiliary processes (checkpointer, walwriter, ...) present now; backends come later."""
        if not self.pid:
            return []
        try:
            pgid_children = Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text().split()
        except OSError:
            return []
        return [int(p) for p in pgid_children]

    def init_pgbench(self, scale: int, timeout: float = 600) -> None:
        pgbench = proc.which("pgbench")
        proc.run(self.netns, [pgbench, "-i", "-q", "-s", str(scale), "-h", str(self.socket_dir), "-p",
                              str(self.port), "-U", PG_USER, "postgres"], timeout=timeout)

    def load_sql(self, sql: str, timeout: float = 900) -> None:
        """Run a loader script with psql (stops at the first error, which the UserError quotes)."""
        path = self.state_dir / "load.sql"
        path.write_text(sql)
        os.chmod(path, 0o644)
        proc.run(self.netns, [proc.which("psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", str(self.socket_dir),
                              "-p", str(self.port), "-U", PG_USER, "-d", "postgres", "-f", str(path)],
                 timeout=timeout)

    def begin_stop(self) -> None:
        """Ask for a fast shutdown without waiting, so it runs while the rest of the path is taken down."""
        if self.process and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGINT)
            except (ProcessLookupError, PermissionError):
                pass

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            # SIGINT = fast shutdown: backends are told to exit, no checkpoint wait beyond what is needed.
            proc.stop_process(self.process, timeout=15, sig=signal.SIGINT)
