"""A DSN's password never leaves the process it was given to (#19): not in any file of the run directory
(decompressed, Parquet included), not in an export, not on any process's command line while the run goes on,
not in what pathprof prints; the run directory is private. Ground truth: a PostgreSQL server that refuses TCP
connections without the password (scram-sha-256), `run --dsn` and `attach --dsn` against it."""
import gzip
import os
import stat
import subprocess
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import PATHPROF, run_pathprof
from probe_harness import PG_BIN, ThrowawayPostgres

pytestmark = pytest.mark.integration
PORT = 55441
SECRET = "pp-Secret-7c1e9a"
DSN = f"host=127.0.0.1 port={PORT} user=postgres dbname=postgres password={SECRET}"


@pytest.fixture(scope="module")
def server():
    pg = ThrowawayPostgres(PORT).start()
    try:
        pg._as_pg([PG_BIN / "psql", "-h", pg.dir, "-p", PORT, "-U", "postgres", "-c",
                   f"ALTER USER postgres PASSWORD '{SECRET}'"])
        (pg.data / "pg_hba.conf").write_text("local all all trust\nhost all all 127.0.0.1/32 scram-sha-256\n")
        pg._as_pg([PG_BIN / "pg_ctl", "-D", pg.data, "reload"])
        time.sleep(0.5)
        refused = subprocess.run([PG_BIN / "psql", f"host=127.0.0.1 port={PORT} user=postgres", "-c", "select 1"],
                                 capture_output=True, text=True, env={**os.environ, "PGPASSWORD": "wrong"})
        assert refused.returncode != 0, "the server must require the password for the test to mean anything"
        yield pg
    finally:
        pg.stop()


class CmdlineWatch:
    """Every process's command line, sampled every 50 ms while a run goes on. pathprof's own command line held
    the secret because the user typed it there; pathprof hides it as soon as it has parsed its arguments, so the
    check on it is that its last sample (`own`) no longer shows it."""

    def __init__(self, own_pid: int | None = None):
        self.own_pid = own_pid
        self.own: str = ""
        self.seen: list[str] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True)

    def _loop(self):
        while not self._stop.is_set():
            for p in Path("/proc").glob("[0-9]*/cmdline"):
                try:
                    line = p.read_bytes().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue
                if self.own_pid is not None and p.parent.name == str(self.own_pid):
                    self.own = line or self.own
                elif SECRET in line:
                    self.seen.append(line)
            time.sleep(0.05)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


def _leaks(root: Path) -> list[str]:
    """Files under root whose contents (decompressed; Parquet as its values) contain the secret."""
    out = []
    for f in root.rglob("*"):
        if not f.is_file():
            continue
        data = f.read_bytes()
        if f.suffix == ".gz":
            data = gzip.decompress(data)
        if f.suffix == ".parquet":
            data = pd.read_parquet(f).astype(str).to_csv().encode()
        if SECRET.encode() in data:
            out.append(str(f))
    return out


def _pathprof(args: list[str], runs_dir: Path) -> tuple[subprocess.CompletedProcess, CmdlineWatch]:
    p = subprocess.Popen([*PATHPROF, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "PATHPROF_RUNS": str(runs_dir)})
    with CmdlineWatch(p.pid) as watch:
        out, err = p.communicate(timeout=180)
    assert p.returncode == 0, err[-2000:]
    assert watch.seen == [], watch.seen           # not pgbench's argv, nor any other process's
    assert watch.own and SECRET not in watch.own and "password=***" in watch.own, watch.own
    assert SECRET not in out + err
    return subprocess.CompletedProcess(args, 0, out, err), watch


def test_run_dsn_keeps_the_password_to_itself(server, runs_dir, tmp_path):
    cp, _ = _pathprof(["run", "--dsn", DSN, "--clients", "2", "--duration", "2", "--trace-sample", "20", "--json"],
                      runs_dir)
    run_dir = Path(__import__("json").loads(cp.stdout)["run_dir"])
    assert _leaks(run_dir) == []
    # what was recorded still names the server, with the secret shown as such
    assert "***" in (run_dir / "topology.json").read_text() and f"port={PORT}" in (run_dir / "pgbench" /
                                                                                  "argv.txt").read_text()
    # private by default
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((run_dir / "run.json").stat().st_mode) == 0o600
    # and nothing derived from it carries the secret either
    exports = tmp_path / "exports"
    exports.mkdir()
    for fmt, name in (("perfetto", "t.json"), ("openmetrics", "m.txt"), ("csv", "s.csv")):
        run_pathprof("export", str(run_dir), "--format", fmt, "-o", str(exports / name), check=True)
    run_pathprof("report", str(run_dir), "--html", str(exports / "r.html"), check=True)
    assert _leaks(exports) == []


def test_attach_dsn_keeps_the_password_to_itself(server, runs_dir):
    load = subprocess.Popen([PG_BIN / "pgbench", "-n", "-f", server.dir / "select1.sql", "-c", "2", "-T", "20",
                             f"host=127.0.0.1 port={PORT} user=postgres dbname=postgres"],
                            env={**os.environ, "PGPASSWORD": SECRET}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        time.sleep(1.5)
        p, _ = _pathprof(["attach", "--dsn", DSN, "--duration", "2", "--json"], runs_dir)
        run_dir = Path(__import__("json").loads(p.stdout)["run_dir"])
        assert _leaks(run_dir) == [] and stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    finally:
        load.kill()
        load.wait()
