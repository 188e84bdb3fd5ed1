"""The cached initdb'ed template: two runs in a row both get a working owned server (the second copied from the
cache, with its own per-run settings), a changed initdb option or a half-built template is never reused, and
each run records where its set-up time went."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from conftest import machine_state, run_pathprof
from pathprof.agent.postgres import template as pg_template
from pathprof.agent.postgres.server import HBA_LINES, INITDB_OPTIONS, PG_USER, ManagedPostgres

pytestmark = pytest.mark.integration

# The unix path in a namespace of this test's own, so a concurrent run of the built-in `unix` does not collide.
SPEC = """
name = "tpl-unix"
description = "unix socket, for the template cache test"
[[hosts]]
name = "host"
netns = "pp-tpl-unix"
[postgres]
host = "host"
listen = "unix"
[client]
host = "host"
[client.targets.socket]
unix = true
"""


@pytest.fixture
def cache_root():
    """A cache root the postgres user can reach (pytest's tmp_path is root-only), removed afterwards."""
    d = Path(tempfile.mkdtemp(prefix="pp-tpl-cache-", dir="/tmp"))
    d.chmod(0o755)
    yield d / "cache"
    shutil.rmtree(d, ignore_errors=True)


def _run(tmp_path, cache: Path, *extra) -> dict:
    spec = tmp_path / "tpl-unix.toml"
    spec.write_text(SPEC)
    env = dict(os.environ, PATHPROF_PG_CACHE=str(cache))
    cp = run_pathprof("run", "--topology", str(spec), "--clients", "2", "--duration", "1", "--probes", "off",
                      "--json", "--no-live", *extra, runs_dir=tmp_path / "runs", env=env, timeout=180)
    assert cp.returncode == 0, cp.stderr[-2000:]
    doc = json.loads(cp.stdout)
    return {"summary": doc, "meta": json.loads((Path(doc["run_dir"]) / "run.json").read_text())}


def test_two_runs_in_a_row_the_second_from_the_cache(tmp_path, cache_root):
    before = machine_state()
    cache = cache_root
    first = _run(tmp_path, cache)
    second = _run(tmp_path, cache, "--pg-set", "work_mem=7MB")
    for r in (first, second):
        assert r["meta"]["status"] == "complete" and r["summary"]["tps"] > 0
        assert r["meta"]["pgbench"]["result"]["transactions"] > 0
    t1, t2 = first["meta"]["postgres"]["template"], second["meta"]["postgres"]["template"]
    assert t1["reused"] is False and t2["reused"] is True and t1["key"] == t2["key"]
    # settings stay per run: the second run's -c reached its server, the first's server never had it
    assert second["meta"]["postgres"]["settings"].get("work_mem") == "7MB"
    assert "work_mem" not in first["meta"]["postgres"]["settings"]
    entries = sorted(p.name for p in cache.iterdir())
    assert entries == [t1["key"]], entries            # one template, no half-built leftovers
    assert (cache / t1["key"] / "template.json").is_file()
    # where the time went is recorded, phase by phase, and the report shows it
    setup = second["meta"]["setup_s"]
    for phase in ("checks", "namespaces", "initdb", "server_start", "pgbench", "results", "teardown", "total"):
        assert phase in setup and setup[phase] >= 0, (phase, setup)
    assert setup["total"] >= setup["pgbench"] >= 1.0       # pgbench ran its whole -T
    # the machine's speed, sampled on every CPU through the load (agent.host.cpu_speed): each CPU at least once in
    # a second of pgbench. How many rounds is the machine's to decide (every 250 ms when the watch gets a CPU; beside
    # the other lane's load it had 2 rounds in one run, ci54a-2): tests/unit/test_cpu_speed.py counts them
    for r in (first, second):
        spd = r["meta"]["host"]["cpu_speed"]
        cpus = len(os.sched_getaffinity(0))              # the CPUs the agent may run on, as the test does
        assert spd["during"]["samples"] >= cpus and len(spd["during"]["per_cpu"]) == cpus, spd
    rep = run_pathprof("report", second["summary"]["run_dir"], check=True).stdout
    # the report names each phase that took 5 ms or more (a template copy can take less: CI run 44, "initdb" left
    # out of a line that was right)
    shown = [k for k, v in setup.items() if k not in ("total", "pgbench") and v >= 0.005]
    assert "set-up" in rep and shown and all(k in rep for k in shown), (shown, rep)
    after = machine_state()      # loop devices and mounts are left out: other engineers' runs make their own
    assert {k: after[k] for k in ("netns", "links", "iptables")} == {k: before[k] for k in ("netns", "links",
                                                                                              "iptables")}
    assert not any(Path("/var/lib/pathprof/state").glob("*-tpl-unix-*"))
    for r in (first, second):
        assert not Path(f"/var/lib/pathprof/journal/{r['meta']['journal']}.jsonl").exists()


def _checksums(data: Path) -> str:
    tool = Path(os.environ.get("PATHPROF_PG_BINDIR", "/usr/lib/postgresql/15/bin")) / "pg_controldata"
    out = subprocess.run([str(tool), str(data)], capture_output=True, text=True, check=True).stdout
    return next(line.split(":")[1].strip() for line in out.splitlines() if "checksum version" in line)


def test_changed_initdb_options_or_half_built_template_are_not_reused(tmp_path, cache_root):
    uid, gid = ManagedPostgres(tmp_path, None, "unix", 5432)._uid()
    root = cache_root
    plain, reused = pg_template.ensure(INITDB_OPTIONS, HBA_LINES, PG_USER, uid, gid, root=root)
    assert reused is False and _checksums(plain) == "0"
    again, reused = pg_template.ensure(INITDB_OPTIONS, HBA_LINES, PG_USER, uid, gid, root=root)
    assert again == plain and reused is True
    checked, reused = pg_template.ensure([*INITDB_OPTIONS, "--data-checksums"], HBA_LINES, PG_USER, uid, gid,
                                         root=root)
    assert reused is False and checked != plain and _checksums(checked) == "1"
    other_hba, reused = pg_template.ensure(INITDB_OPTIONS, [*HBA_LINES, "host all all 198.19.0.0/16 trust"],
                                           PG_USER, uid, gid, root=root)
    assert reused is False and other_hba not in (plain, checked)
    assert "198.19.0.0/16" in (other_hba / "pg_hba.conf").read_text()
    # a template directory without its completion marker (not made by a finished build) is rebuilt, not used;
    # and a build killed midway (its pid gone) is swept by the next build
    (plain.parent / "template.json").unlink()
    (plain / "PG_VERSION").unlink()
    stale = root / ".build-pg15-0000000000000000-999999999"
    stale.mkdir()
    rebuilt, reused = pg_template.ensure(INITDB_OPTIONS, HBA_LINES, PG_USER, uid, gid, root=root)
    assert reused is False and (rebuilt / "PG_VERSION").is_file() and (rebuilt.parent / "template.json").is_file()
    assert not stale.exists()
    # a template of binaries no longer installed (an upgrade) is removed by the next build; other options stay
    old = root / "pg15-00000000000000aa"
    (old / "pgdata").mkdir(parents=True)
    (old / "template.json").write_text(json.dumps({**json.loads((rebuilt.parent / "template.json").read_text()),
                                                   "version": "postgres (PostgreSQL) 15.1"}))
    (rebuilt.parent / "template.json").unlink()
    pg_template.ensure(INITDB_OPTIONS, HBA_LINES, PG_USER, uid, gid, root=root)
    assert not old.exists() and checked.exists() and other_hba.exists()
