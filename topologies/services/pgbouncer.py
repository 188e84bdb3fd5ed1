"""PgBouncer in front of the owned PostgreSQL.

Sized so that the pool itself never queues a pgbench client: in session mode every client holds a server
connection for its whole life, so `default_pool_size` = clients (unless the spec says otherwise), and
`max_client_conn` leaves room for the readiness check and an admin connection. pgbouncer refuses to run as
root, so it runs as `postgres` with its files in a directory of its own under the run's state directory.
"""
from __future__ import annotations

import re
import shutil
import signal
import subprocess

from pathprof.agent.host import proc
from pathprof.agent.host.netns import in_netns
from pathprof.errors import UserError
from pathprof.topologies.services import Opt, Service

# Named (protocol-level) prepared statements in transaction pooling arrived in pgbouncer 1.21
# (max_prepared_statements); before that a statement prepared on one server connection is missing on the next.
PREPARED_IN_TRANSACTION_MODE = (1, 21)


def installed_version() -> tuple[int, int] | None:
    try:
        out = subprocess.run([proc.which("pgbouncer"), "--version"], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired, UserError):
        return None
    m = re.search(r"PgBouncer (\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else None


class PgBouncer(Service):
    kind = "pgbouncer"
    role = "pooler"
    stop_signal = signal.SIGINT      # "safe shutdown": wait for queries to finish, then exit
    OPTIONS = {
        "pool_mode": Opt(str, "session", ("session", "transaction", "statement")),
        "listen": Opt(str, "127.0.0.1", help="address pgbouncer listens on, in its host"),
        "port": Opt(int, 6432),
        "pool_size": Opt(int, 0, help="server connections per pool; 0 = one per pgbench client"),
        "user": Opt(str, "postgres", help="unprivileged user pgbouncer runs as"),
    }

    def check_workload(self, mode: str, connect: bool, clients: int = 1, threads: int | None = None) -> None:
        if self.opts["pool_mode"] == "session" or mode != "prepared":
            return
        v = installed_version()
        if v is None or v < PREPARED_IN_TRANSACTION_MODE:
            have = f"pgbouncer {v[0]}.{v[1]}" if v else "the installed pgbouncer"
            raise UserError(
                f"{have} cannot carry protocol-level prepared statements (pgbench --mode prepared) in "
                f"{self.opts['pool_mode']} pooling: a statement prepared on one server connection is unknown on the "
                "next transaction's connection (support came in pgbouncer 1.21). Use --mode simple or --mode "
                f"extended with pool_mode {self.opts['pool_mode']}, or session pooling.")

    def config(self, ctx, workdir) -> str:
        pg = self.tcp_postgres(ctx)
        self._pg_user, self._pg_db = pg.user, pg.dbname
        clients = self.clients(ctx)
        pool = self.opts["pool_size"] or clients
        self._pool = pool
        v = installed_version()
        lines = [
            "[databases]",
            f"{pg.dbname} = host={pg.address} port={pg.port} dbname={pg.dbname} user={pg.user}",
            "",
            "[pgbouncer]",
            f"listen_addr = {self.opts['listen']}",
            f"listen_port = {self.opts['port']}",
            f"unix_socket_dir = {workdir}",       # its socket stays in the run, not /tmp or /var/run
            f"pidfile = {workdir}/pgbouncer.pid",
            "auth_type = trust",                  # the owned server trusts 198.18.0.0/15 and 127.0.0.1 too
            f"auth_file = {workdir}/userlist.txt",  # trust still requires the user to be listed
            f"admin_users = {pg.user}",
            f"pool_mode = {self.opts['pool_mode']}",
            f"default_pool_size = {pool}",
            "min_pool_size = 0",
            "reserve_pool_size = 0",
            f"max_client_conn = {clients + 10}",
            "max_db_connections = 0",
            "server_reset_query = DISCARD ALL",   # the default; applies in session mode only
            "ignore_startup_parameters = extra_float_digits",
            "log_connections = 0",                # a line per pgbench -C connection would be noise on the path
            "log_disconnections = 0",
            "log_pooler_errors = 1",
            "stats_period = 60",
        ]
        if v and v >= PREPARED_IN_TRANSACTION_MODE:
            lines.append("max_prepared_statements = 200")
        return "\n".join(lines) + "\n"

    def start(self, ctx) -> None:
        user = self.opts["user"]
        workdir = self.workdir(ctx, owner=user)
        (workdir / "userlist.txt").write_text(f'"{ctx.postgres.user if ctx.postgres else "postgres"}" ""\n')
        conf = workdir / "pgbouncer.ini"
        conf.write_text(self.config(ctx, workdir))
        self.log_path.touch()
        for f in (conf, workdir / "userlist.txt", self.log_path):
            shutil.chown(f, user, user)
        # No -d: in the foreground its pid is the one we journal and the probes track.
        self.spawn(ctx, [proc.which("pgbouncer"), str(conf)], user=user)
        self.wait_sql(ctx, self.opts["listen"], self.opts["port"])
        # the counters connection now, before the probes follow pgbouncer: they are told to leave it
        # (own_sockets); opened later, from the sampling thread, its SHOW POOLS would be measured as requests
        try:
            self._connect_admin()
        except Exception:
            self._admin = None          # counters() tries again and records why it cannot

    counters_source = "pgbouncer admin console (SHOW POOLS)"
    busy_is = "active (sv_active)"

    def counters(self) -> dict | None:
        """SHOW POOLS on pgbouncer's admin console, over TCP in its namespace (so pgbouncer sees an ordinary client
        on its service port), for the run's pool: clients waiting for a server connection and the longest wait."""
        if getattr(self, "_admin", None) is None:
            self._connect_admin()
        r = self._admin_row("SHOW POOLS")
        if r is None:
            return None
        us = int(r.get("maxwait", 0)) * 1_000_000 + int(r.get("maxwait_us", 0) or 0)
        return {"cl_waiting": int(r["cl_waiting"]), "cl_active": int(r["cl_active"]),
                "sv_active": int(r["sv_active"]), "maxwait_us": us,
                "servers": getattr(self, "_pool", None), "servers_busy": int(r["sv_active"]),
                **self._wait_timer()}

    def _admin_row(self, command: str) -> dict | None:
        """The run's database's row of an admin console SHOW."""
        cur = self._admin.execute(command)
        cols = [c.name for c in cur.description]
        return next((r for r in (dict(zip(cols, row)) for row in cur.fetchall()) if r.get("database") == self._pg_db),
                    None)

    def _wait_timer(self) -> dict:
        """pgbouncer's own clock of the wait (SHOW STATS): the µs its clients spent waiting for a server and the
        transactions it served, both cumulative, so two samples give its mean wait per transaction."""
        r = self._admin_row("SHOW STATS")
        if r is None or "total_wait_time" not in r:
            return {}
        return {"wait_us_total": int(r["total_wait_time"]), "xacts_total": int(r["total_xact_count"])}

    def _connect_admin(self) -> None:
        import psycopg
        self._admin = in_netns(self.netns, lambda: psycopg.connect(
            host=self.opts["listen"], port=self.opts["port"], dbname="pgbouncer", user=self._pg_user,
            autocommit=True, connect_timeout=3, cursor_factory=psycopg.ClientCursor))   # simple protocol only

    def describe(self) -> dict:
        d = super().describe()
        v = installed_version()
        d["version"] = f"{v[0]}.{v[1]}" if v else None
        return d
