"""A throwaway PostgreSQL + pgbench + ProbeSession, for the probe integration tests (no topology needed)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

PG_BIN = Path("/usr/lib/postgresql/15/bin")


class ThrowawayPostgres:
    def __init__(self, port: int):
        self.port = port
        self.dir = Path(tempfile.mkdtemp(prefix="pp-ta-it-"))
        shutil.chown(self.dir, "postgres")
        self.data = self.dir / "data"

    def start(self) -> "ThrowawayPostgres":
        self._as_pg([PG_BIN / "initdb", "-D", self.data, "-A", "trust", "-U", "postgres"])
        opts = (f"-c port={self.port} -c unix_socket_directories={self.dir} -c listen_addresses=127.0.0.1 "
                "-c max_connections=40 -c shared_buffers=32MB")
        self._as_pg([PG_BIN / "pg_ctl", "-D", self.data, "-l", self.dir / "log", "-w", "-o", opts, "start"])
        for name, sql in (("select1.sql", "select 1;\n"), ("sleep.sql", "select pg_sleep(0.002);\n")):
            (self.dir / name).write_text(sql)
        return self

    @property
    def pid(self) -> int:
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def children(self) -> list[int]:
        return [int(c) for c in Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text().split()]

    def stop(self) -> None:
        subprocess.run(["runuser", "-u", "postgres", "--", str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m",
                        "immediate", "stop"], capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)

    def _as_pg(self, argv):
        subprocess.run(["runuser", "-u", "postgres", "--", *map(str, argv)], check=True, capture_output=True)


def busy_ns() -> int:
    from pathprof.agent.host.machine import proc_stat_ns
    return proc_stat_ns()[0]


def profile(pg: ThrowawayPostgres, level: str = "basic", *, unix: bool = False, script: str = "select1.sql",
            clients: int = 1, duration: int = 2, lo_device: bool = False) -> dict:
    """Run pgbench under a ProbeSession; return the views plus pgbench's numbers."""
    from pathprof.agent.probing.session import ProbeConfig, ProbeSession
    from pathprof.analysis import stages as views
    # always on (no measurement windows): these tests divide by all of pgbench's transactions
    s = ProbeSession(ProbeConfig(level=level, netns=[None], service_ports=[pg.port], window_s=0,
                                 lo_device=lo_device))
    s.start()
    try:
        s.track(pg.pid, "postmaster")
        for c in pg.children():
            s.track(c, "pg_aux")
        host = str(pg.dir) if unix else "127.0.0.1"
        # setpriv execs pgbench in its own process (runuser forks it: the child could exist before the track below,
        # untracked, and the run had no pgbench stages at all: KeyError 'wire.pgbench' in fresh-clone CI r8)
        p = subprocess.Popen(["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups",
                              str(PG_BIN / "pgbench"), "-n", "-M", "prepared",
                              "-f", str(pg.dir / script), "-c", str(clients), "-j", str(min(clients, 2)),
                              "-T", str(duration), "-h", host, "-p", str(pg.port), "postgres"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        s.track(p.pid, "pgbench")
        s.reset()
        s.start_windows(duration)
        b0, t0 = busy_ns(), time.monotonic_ns()
        out, err = p.communicate(timeout=duration + 60)
        b1, t1 = busy_ns(), time.monotonic_ns()
        res = s.stop()
    finally:
        s.close()
    assert p.returncode == 0, err
    tps = float(re.search(r"tps = ([\d.]+)", out).group(1))
    txns = int(re.search(r"processed: (\d+)", out).group(1))
    lat_ms = float(re.search(r"latency average = ([\d.]+) ms", out).group(1))
    cycle = clients * 1e6 / tps
    lv = views.latency_view(res.stages, txns, lat_ms * 1000, cycle_us=cycle)
    # the CPU table's interval is the window's: close against the busy time read at its edges (no-HZ where the
    # kernel keeps it, with the idle row that goes with it), as a run does
    from pathprof.agent.probing.windows import cpu_in_windows
    win = cpu_in_windows(res.windows) if res.windows else {"busy_ns": b1 - b0, "elapsed_ns": t1 - t0}
    cv = views.cpu_view(res.cpu, txns, win["busy_ns"], win["elapsed_ns"], os.cpu_count(), clients=clients,
                        latency_us=lv["total_us"])
    names = {}
    for st in lv["stages"]:
        names[st["name"]] = names.get(st["name"], 0.0) + st["us_per_txn"]
    return {"tps": tps, "txns": txns, "latency": lv, "cpu": cv, "names": names, "result": res,
            "cost_ns_per_txn": views.probe_cost_ns_per_txn(res.cost, txns)}
