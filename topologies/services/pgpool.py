"""pgpool-II (4.3) in front of the owned PostgreSQL, as a pure connection pooler.

Raw clustering mode with a single backend: no streaming-replication checks, no health checks, no load
balancing, no query cache — so the hop measured is pgpool's proxying and connection cache, which is what the
published "pgpool costs ~80 %" figure was about. pgpool pre-forks `num_init_children` processes and each serves
one client at a time, so there must be at least one child per pgbench client (plus one spare, for the readiness
check or a late monitoring connection) or clients queue in its listen backlog. `max_pool` = 1: one cached backend
connection per child, since every client uses the same user/database.
"""
from __future__ import annotations

import shutil
import signal

from pathprof.agent.host import proc
from pathprof.errors import UserError
from pathprof.topologies.services import Opt, Service


class PgPool(Service):
    kind = "pgpool"
    role = "pooler"
    stop_signal = signal.SIGINT      # fast shutdown (SIGTERM is "smart": it would wait for clients)
    OPTIONS = {
        "listen": Opt(str, "127.0.0.1", help="address pgpool listens on, in its host"),
        "port": Opt(int, 9999),
        "num_init_children": Opt(int, 0, help="pre-forked children; 0 = pgbench clients + 1"),
        "max_pool": Opt(int, 1),
        "user": Opt(str, "postgres", help="unprivileged user pgpool runs as"),
    }

    def check_workload(self, mode: str, connect: bool, clients: int = 1, threads: int | None = None) -> None:
        children = self.opts["num_init_children"]
        if not children or children >= clients:
            return
        if not connect:
            raise UserError(
                f"pgpool with num_init_children = {children} cannot serve {clients} pgbench clients on long "
                f"connections: each child serves one client for its whole session, so {clients - children} "
                "clients would wait for a child until the run ends (pgbench never finishes). Use --connect --threads "
                f"{clients} (a new connection per transaction: clients then queue for a free child, shown in the "
                f"connection setup) or --option children={clients} or more.")
        if (threads or 1) < clients:
            raise UserError(
                f"pgpool with num_init_children = {children} < {clients} clients deadlocks pgbench with fewer threads "
                "than clients: pgbench connects a client while the same thread's other clients hold every child, "
                f"and a blocking connect cannot be answered. Use --threads {clients} (one client per thread).")

    def config(self, ctx, workdir) -> str:
        pg = self.tcp_postgres(ctx)
        clients = self.clients(ctx)
        children = self.opts["num_init_children"] or clients + 1
        settings = {
            "backend_clustering_mode": "'raw'",
            "listen_addresses": f"'{self.opts['listen']}'",
            "port": self.opts["port"],
            "socket_dir": f"'{workdir}'",
            "pcp_listen_addresses": "''",          # no PCP over TCP; its unix socket stays in the run
            "pcp_socket_dir": f"'{workdir}'",
            "wd_ipc_socket_dir": f"'{workdir}'",
            "backend_hostname0": f"'{pg.address}'",
            "backend_port0": pg.port,
            "backend_weight0": 1,
            "backend_flag0": "'DISALLOW_TO_FAILOVER'",
            "enable_pool_hba": "off",
            "pool_passwd": "''",                  # trust end to end: no password file to read
            "num_init_children": children,
            "max_pool": self.opts["max_pool"],
            "reserved_connections": 0,
            "child_life_time": 0,                 # never recycle children during a run
            "child_max_connections": 0,
            "connection_life_time": 0,
            "client_idle_limit": 0,
            "connection_cache": "on",
            "load_balance_mode": "off",
            "replicate_select": "off",
            "insert_lock": "off",
            "health_check_period": 0,
            "sr_check_period": 0,
            "failover_on_backend_error": "off",
            "use_watchdog": "off",
            "memory_cache_enabled": "off",
            "log_destination": "'stderr'",
            "logging_collector": "off",
            "log_connections": "off",
            "log_min_messages": "warning",
            "pid_file_name": f"'{workdir}/pgpool.pid'",
            "logdir": f"'{workdir}'",              # where pgpool_status is written
            "memqcache_oiddir": f"'{workdir}/oiddir'",
        }
        return "".join(f"{k} = {v}\n" for k, v in settings.items())

    def start(self, ctx) -> None:
        user = self.opts["user"]
        workdir = self.workdir(ctx, owner=user)
        conf, pcp, hba = workdir / "pgpool.conf", workdir / "pcp.conf", workdir / "pool_hba.conf"
        conf.write_text(self.config(ctx, workdir))
        pcp.write_text("")                        # no PCP users: pathprof never administers pgpool
        hba.write_text("")
        self.log_path.touch()
        for f in (conf, pcp, hba, self.log_path):
            shutil.chown(f, user, user)
        # -n: stay in the foreground (the pid we journal is the pgpool parent; its children are followed).
        # -D: discard any pgpool_status, so a backend once marked down is not remembered.
        self.spawn(ctx, [proc.which("pgpool"), "-n", "-D", "-f", str(conf), "-F", str(pcp), "-a", str(hba)],
                   user=user)
        self.wait_sql(ctx, self.opts["listen"], self.opts["port"])

    def describe(self) -> dict:
        d = super().describe()
        d["children"] = child_pids(self.popen.pid) if self.popen else []
        return d


def child_pids(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []
