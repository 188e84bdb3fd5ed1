from pathlib import Path

import pytest
from pathprof.agent.postgres import pgbench
from pathprof.errors import UserError

DATA = Path(__file__).parent / "data" / "pgbench"


def test_summary_long_connections():
    r = pgbench.parse_summary((DATA / "prepared_c4.stdout").read_text())
    assert r.transactions == 124758
    assert r.failed == 0
    assert r.tps == pytest.approx(41748.177755)
    assert r.latency_ms["mean"] == pytest.approx(0.078)
    assert r.connection_time_ms == pytest.approx(11.883)
    assert r.version.startswith("15.18")


def test_summary_new_connection_per_transaction():
    r = pgbench.parse_summary((DATA / "connect_c1.stdout").read_text())
    assert r.transactions == 283
    assert r.tps == pytest.approx(140.882652)
    assert r.connection_time_ms == pytest.approx(5.953)


def test_progress_lines():
    lines = (DATA / "prepared_c4.stderr").read_text().splitlines()
    p = [pgbench.parse_progress(l) for l in lines]
    assert p[0].elapsed_s == 1.0 and p[0].tps == pytest.approx(52851.0) and p[0].latency_ms == pytest.approx(0.055)
    assert p[1].failed == 0
    assert pgbench.parse_progress("pgbench: error: connection refused") is None


def test_logs_give_percentiles(tmp_path):
    for f in DATA.glob("prepared_c4.log.*"):
        (tmp_path / f"pgbench_log.123{f.suffix if f.suffix != '.0' else ''}").write_text(f.read_text())
    logs = pgbench.read_logs(tmp_path)
    assert len(logs) == 350
    raw = sorted(int(l.split()[2]) for f in DATA.glob("prepared_c4.log.*") for l in f.read_text().splitlines())
    pct = pgbench.latency_percentiles(logs)
    assert pct["mean"] == pytest.approx(sum(raw) / len(raw) / 1000)
    assert pct["p50"] <= pct["p95"] <= pct["p99"]
    pgbench.compress_logs(tmp_path)
    assert all(p.suffix == ".gz" for p in tmp_path.iterdir())
    assert len(pgbench.read_logs(tmp_path)) == 350


def test_workload_defaults_and_limits(tmp_path):
    w = pgbench.Workload(clients=16).validate(ncpu=2)
    assert w.threads == 2
    assert pgbench.Workload(clients=1).validate(ncpu=2).threads == 1
    for bad in (dict(clients=0), dict(clients=-3), dict(clients=5000), dict(duration_s=0), dict(mode="fast"),
                dict(script="nope"), dict(script=f"@{tmp_path}/missing.sql"), dict(clients=2, threads=3)):
        with pytest.raises(UserError):
            pgbench.Workload(**bad).validate(ncpu=2)


def test_argv(tmp_path):
    w = pgbench.Workload(clients=4, duration_s=5, connect=True, rate=100).validate(2)
    argv = pgbench.build_argv(w, pgbench.Target("198.18.1.2", 5432), tmp_path / "log", tmp_path)
    assert argv[argv.index("-c") + 1] == "4" and argv[argv.index("-j") + 1] == "2"
    assert "-C" in argv and argv[argv.index("-R") + 1] == "100" and argv[argv.index("-M") + 1] == "prepared"
    assert (tmp_path / "select1.sql").read_text().strip() == "select 1;"
    w2 = pgbench.Workload(script="tpcb-like").validate(2)
    assert w2.needs_tables
    assert "-b" in pgbench.build_argv(w2, pgbench.Target("/tmp/s", 5432), tmp_path, tmp_path)


MULTI = """tps = 647.648296 (without initial connection time)
SQL script 1: <builtin: TPC-B (sort of)>
 - weight: 5 (targets 50.0% of total)
 - 668 transactions (51.6% of total, tps = 334.334669)
 - number of failed transactions: 0 (0.000%)
 - latency average = 2.725 ms
 - latency stddev = 2.126 ms
 - statement latencies in milliseconds and failures:
         0.002           0  \\set aid random(1, 100000 * :scale)
         0.041           0  UPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid;
         2.471           3  END;
SQL script 2: <builtin: select only>
 - weight: 5 (targets 50.0% of total)
 - 626 transactions (48.4% of total, tps = 313.313627)
 - number of failed transactions: 0 (0.000%)
 - latency average = 0.048 ms
 - latency stddev = 0.130 ms
 - statement latencies in milliseconds and failures:
         0.046           0  SELECT abalance FROM pgbench_accounts WHERE aid = :aid;
"""


def test_per_script_and_per_statement_latencies():
    from pathprof.agent.postgres.pgbench import parse_summary
    r = parse_summary(MULTI)
    assert r.tps == pytest.approx(647.648296)
    a, b = r.scripts
    assert (a["name"], a["weight"], a["transactions"], a["tps"]) == ("<builtin: TPC-B (sort of)>", 5, 668, 334.334669)
    assert a["latency_ms"] == {"mean": 2.725, "stddev": 2.126}
    assert [s["sql"] for s in a["statements"]][-1] == "END;" and a["statements"][-1]["failures"] == 3
    assert a["statements"][0]["sql"] == "\\set aid random(1, 100000 * :scale)"
    assert b["statements"] == [{"latency_ms": 0.046, "failures": 0,
                                "sql": "SELECT abalance FROM pgbench_accounts WHERE aid = :aid;"}]


def test_statements_render_in_the_report():
    from pathprof.agent.postgres.pgbench import parse_scripts
    from pathprof.analysis.report.render import render_to_string, statements_table
    out = render_to_string(statements_table({"scripts": parse_scripts(MULTI)}))
    assert "TPC-B" in out and "2.471" in out and "3 failed" in out and "334 TPS" in out
