"""Each bad input: one clear line, a non-zero exit, no traceback, nothing left behind."""
import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest
from conftest import PATHPROF, machine_state, run_pathprof

pytestmark = pytest.mark.integration


def _fails_cleanly(cp, *needles):
    assert cp.returncode == 2, (cp.returncode, cp.stderr)
    assert "Traceback" not in cp.stderr
    line = [l for l in cp.stderr.splitlines() if l.startswith("pathprof: error:")]
    assert line, cp.stderr
    for n in needles:
        assert n in line[-1], line[-1]
    return line[-1]


@pytest.mark.parametrize("args,needles", [
    (["--topology", "warp-drive"], ["unknown topology", "loopback", "nic"]),
    (["--clients", "0"], ["--clients"]),
    (["--clients", "-4"], ["--clients"]),
    (["--clients", "20", "--pg-set", "max_connections=10"], ["exceeds", "max_connections=10"]),
    (["--duration", "0"], ["--duration"]),
    (["--script", "@/nonexistent/x.sql"], ["does not exist"]),
    (["--pg-set", "shared_buffers"], ["KEY=VALUE"]),
    (["--userland-proxy", "off"], ["no option 'userland_proxy'"]),
    (["--topology", "/nonexistent/my.toml"], ["does not exist"]),
])
def test_bad_run_arguments(args, needles, runs_dir):
    before = machine_state()
    _fails_cleanly(run_pathprof("run", "--probes", "off", *args, runs_dir=runs_dir), *needles)
    assert machine_state() == before
    assert not runs_dir.exists() or not any(runs_dir.iterdir())


def test_name_already_taken_is_refused_and_kept(runs_dir):
    subprocess.run(["ip", "netns", "add", "pp-loopback"], check=True)
    try:
        before = machine_state()
        _fails_cleanly(run_pathprof("run", "--topology", "loopback", "--probes", "off", "--duration", "2",
                                    runs_dir=runs_dir), "pp-loopback already exists", "pathprof cleanup")
        assert machine_state() == before  # the existing namespace is not ours to remove
    finally:
        subprocess.run(["ip", "netns", "del", "pp-loopback"])


def test_port_already_taken(tmp_path, runs_dir):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    port = s.getsockname()[1]
    spec = tmp_path / "rootns.toml"
    spec.write_text(f'''name = "rootns"
[postgres]
listen = "127.0.0.1"
port = {port}
[client]
[client.targets.lo]
address = "127.0.0.1"
''')
    try:
        before = machine_state()
        _fails_cleanly(run_pathprof("run", "--topology", str(spec), "--probes", "off", "--duration", "2",
                                    runs_dir=runs_dir), f"port {port} is already in use")
        assert machine_state() == before
    finally:
        s.close()


def test_missing_postgres_tools_name_the_package(tmp_path, runs_dir):
    env = dict(os.environ, PATHPROF_PG_BINDIR=str(tmp_path))
    cp = run_pathprof("run", "--probes", "off", runs_dir=runs_dir, env=env)
    _fails_cleanly(cp, "pgbench", "postgresql")


def test_not_root(runs_dir):
    # The clone may sit where only root may enter (/root, a mktemp -d): an ambient CAP_DAC_READ_SEARCH lets the
    # unprivileged user reach the .venv's interpreter and read its files, and nothing more (it is still not root).
    cp = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                         "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search", *PATHPROF, "run",
                         "--probes", "off", "--runs-dir", "/tmp/pp-test-nobody"], capture_output=True, text=True)
    _fails_cleanly(cp, "root")


def test_dsn_unreachable(runs_dir):
    _fails_cleanly(run_pathprof("run", "--dsn", "host=127.0.0.1 port=1 user=postgres connect_timeout=2",
                                "--probes", "off", runs_dir=runs_dir), "cannot use --dsn")


def test_dsn_rejecting_auth_and_working_dsn(runs_dir):
    import tempfile

    from pathprof.agent.postgres.server import ManagedPostgres
    state = Path(tempfile.mkdtemp(prefix="pp-test-dsn-", dir="/tmp"))
    state.chmod(0o755)  # the postgres user must reach its data directory
    pg = ManagedPostgres(state / "pg", None, "unix", 55479)
    pg.initdb()
    pg.start()
    try:
        bad = f"host={pg.socket_dir} port=55479 user=nobody_here dbname=postgres"
        _fails_cleanly(run_pathprof("run", "--dsn", bad, "--probes", "off", runs_dir=runs_dir),
                       "cannot use --dsn", "nobody_here")
        import json
        good = f"host={pg.socket_dir} port=55479 user=postgres dbname=postgres"
        cp = run_pathprof("run", "--dsn", good, "--probes", "off", "--clients", "2", "--duration", "2", "--json",
                          runs_dir=runs_dir, check=True)
        assert json.loads(cp.stdout)["tps"] > 0
        _fails_cleanly(run_pathprof("run", "--dsn", good, "--probes", "off", "--clients", "500",
                                    runs_dir=runs_dir), "exceeds what the server allows")
    finally:
        pg.stop()
        shutil.rmtree(state, ignore_errors=True)


def test_corrupt_run_directory(tmp_path):
    (tmp_path / "run.json").write_text("{not json")
    _fails_cleanly(run_pathprof("report", str(tmp_path)), "corrupt")
    (tmp_path / "run.json").write_text('{"schema": "pathprof-run/9.0"}')
    _fails_cleanly(run_pathprof("report", str(tmp_path)), "not supported")
    _fails_cleanly(run_pathprof("report", str(tmp_path / "nope")), "not a run directory")
