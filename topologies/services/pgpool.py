"""pgpool-II (4.3) in front of the owned PostgreSQL, as a pure connection pooler.

Raw clustering mode with a single backend: no streaming-replication checks, no health checks, no load
balancing, no query cache — so the hop measured is pgpool's proxying and connection cache, which is what the
published "pgpool costs ~80 %" figure was about. pgpool pre-forks `num_init_children` processes and each serves
one client at a time, so there must be at least one child per pgbench client or clients queue in its listen backlog.
`max_pool` = 1: one cached backend connection per child, since every client uses the same user/database.

pgpool's own counters (SHOW POOL_POOLS, through its ordinary port: pgpool answers SHOW itself) need a client
connection, and a connection holds a child for its whole life. So pgpool gets one child more than the clients may
use, and pathprof's counters connection takes it as soon as pgpool is up, before pgbench starts: the clients compete
for exactly `num_init_children` children, and the samples never wait for a child themselves (with one child and
four -C clients they would queue with the clients and then report their own child as the busy one).
"""
from __future__ import annotations

import os
import shutil
import signal

from pathprof.agent.host import proc
from pathprof.agent.host.netns import in_netns
from pathprof.errors import UserError
from pathprof.topologies.services import Opt, Service


class PgPool(Service):
    kind = "pgpool"
    role = "pooler"
    stop_signal = signal.SIGINT      # fast shutdown (SIGTERM is "smart": it would wait for clients)
    OPTIONS = {
        "listen": Opt(str, "127.0.0.1", help="address pgpool listens on, in its host"),
        "port": Opt(int, 9999),
        "num_init_children": Opt(int, 0, help="pre-forked children the clients may use; 0 = one per pgbench client "
                                 "(pgpool gets one more, held by pathprof's counters connection)"),
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
        self._pg_user, self._pg_db = pg.user, pg.dbname
        self.children = self.opts["num_init_children"] or clients
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
            "num_init_children": self.children + 1,   # + pathprof's counters connection (module docstring)
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
        self._open_admin()

    servers_are = "child"
    # a child shows a session only once it has read the client's startup and its backend is ready: under -C, where
    # each client makes the child open a backend again, about a third of the time it is taken
    busy_is = "in a client session by their status"
    counters_source = "SHOW POOL_POOLS; clients waiting: its listen socket's accept queue"

    def _open_admin(self) -> None:
        """The counters connection, taking pgpool's extra child before any client can (see the module docstring);
        pgpool cannot be measured as asked without it, so a refusal stops the build."""
        import psycopg
        try:
            self._admin = in_netns(self.netns, lambda: psycopg.connect(
                host=self.opts["listen"], port=self.opts["port"], dbname=self._pg_db, user=self._pg_user,
                autocommit=True, connect_timeout=3, cursor_factory=psycopg.ClientCursor))
            # forwarded to the backend: the backend pid names this connection's child in SHOW POOL_POOLS
            self._admin_backend = str(self._admin.execute("select pg_backend_pid()").fetchone()[0])
            self._admin_child = next((int(r["pool_pid"]) for r in self._show("SHOW POOL_POOLS")
                                      if r.get("pool_backendpid") == self._admin_backend), None)
        except Exception as e:
            raise self.fail(f"pathprof's counters connection was refused ({str(e).strip()[:200]})") from None

    def _show(self, what: str) -> list[dict]:
        cur = self._admin.execute(what)
        cols = [c.name for c in cur.description]
        return [dict(zip(cols, (str(v) for v in row))) for row in cur.fetchall()]

    def counters(self) -> dict | None:
        """Children in a client session (SHOW POOL_POOLS status), connections they took over their life, and
        clients waiting for a child: pgpool counts none (they are in the kernel's accept queue of its listen
        socket), so that queue's length is read from /proc/<pgpool>/net/tcp."""
        if getattr(self, "_admin", None) is None:
            return None
        waiting = accept_queue(self.popen.pid, self.opts["port"]) if self.popen else 0
        session, served = pool_usage(self._show("SHOW POOL_POOLS"), self._admin_backend)
        return {"cl_waiting": waiting, "servers": len(session), "servers_busy": sum(session.values()),
                "served": served}

    def own_pids(self) -> list[int]:
        """The child pathprof's counters connection holds and that child's backend: they serve only its SHOW
        queries, so the probes never follow them (their traffic is no transaction, their CPU no hop's)."""
        if getattr(self, "_admin", None) is None:
            return []
        return [p for p in (getattr(self, "_admin_child", None), int(self._admin_backend)) if p]

    def final_counters(self) -> dict | None:
        """pgpool's own tables as they are when pgbench has finished, for the run directory."""
        if getattr(self, "_admin", None) is None:
            return None
        return {"show_pool_processes": self._show("SHOW POOL_PROCESSES"), "show_pool_pools": self._show(
            "SHOW POOL_POOLS"), "counters_child_backend_pid": self._admin_backend}

    def stop(self) -> None:
        self.close_counters()
        super().stop()

    def describe(self) -> dict:
        d = super().describe()
        d["children"] = child_pids(self.popen.pid) if self.popen else []
        d["children_for_clients"] = getattr(self, "children", None)
        return d


def pool_usage(rows: list[dict], own_backend_pid: str) -> tuple[dict[str, bool], int]:
    """({child pid: busy with a client}, client connections the children took over their life) from SHOW
    POOL_POOLS rows (one per child and pool slot), the child holding `own_backend_pid` (pathprof's own connection)
    left out. A child is busy from its accept on: its `status` (pgpool 4.3+) is anything but "Wait for connection";
    pool_connected, the fallback, only once its backend connection is up (about half the time under -C, where each
    client makes the child open a backend again)."""
    own = {r.get("pool_pid") for r in rows if r.get("pool_backendpid") == own_backend_pid}
    busy: dict[str, bool] = {}
    served: dict[str, int] = {}
    for r in rows:
        pid = r.get("pool_pid")
        if pid in own:
            continue
        working = (r["status"] != "Wait for connection") if "status" in r else r.get("pool_connected") == "1"
        busy[pid] = busy.get(pid, False) or working
        if "client_connection_count" in r:            # per child, repeated on each of its slots
            served[pid] = int(r["client_connection_count"] or 0)
        else:
            served[pid] = served.get(pid, 0) + int(r.get("pool_counter") or 0)
    return busy, sum(served.values())


def accept_queue(pid: int, port: int) -> int:
    """Connections waiting in the accept queue of the socket listening on `port` in `pid`'s namespace (a listening
    socket's rx_queue in /proc/net/tcp is its accept backlog). The kernel lists listening sockets first: reading
    stops at the first other line, so thousands of TIME_WAIT sockets (a -C run) are never formatted. Few, large
    reads: on a thread beside a busy one each blocking call waits for the GIL again (a 2-line file took 160 ms
    beside the trace ring's consumer, 1 sample in 3 s in CI)."""
    total = 0
    for name in ("tcp", "tcp6"):
        try:
            fd = os.open(f"/proc/{pid}/net/{name}", os.O_RDONLY)
        except OSError:
            continue
        try:
            total += _listening_backlog(fd, port)
        finally:
            os.close(fd)
    return total


def _listening_backlog(fd: int, port: int) -> int:
    total, rest, header = 0, b"", True
    while chunk := os.read(fd, 1 << 16):
        lines = (rest + chunk).split(b"\n")
        rest = lines.pop()
        for line in lines:
            if header:
                header = False
                continue
            p = line.split()
            if len(p) <= 4:
                continue
            if p[3] != b"0A":
                return total
            if int(p[1].rsplit(b":", 1)[1], 16) == port:
                total += int(p[4].split(b":")[1], 16)
    return total


def child_pids(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []
