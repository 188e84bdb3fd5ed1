"""CPU quotas: parsing --cpu-quota, reading a cgroup's quota and counters (v1 and v2 files), the cross-check."""
import pytest
from pathprof.agent.host import cpu_quota
from pathprof.analysis.quota import cause_detail, quota_check, quota_note
from pathprof.errors import UserError


def test_parse():
    q = cpu_quota.parse("server=25/100,client=1.5/10,hop=5/100")
    assert q == {"server": cpu_quota.Quota(25000, 100000), "client": cpu_quota.Quota(1500, 10000),
                 "hop": cpu_quota.Quota(5000, 100000)}
    for bad in ("backend=25/100", "server=25", "server=25/0.5", "server=0.2/100", "server"):
        with pytest.raises(UserError):
            cpu_quota.parse(bad)


def test_quota_and_counters_v1_and_v2(tmp_path):
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("5000 100000\n")
    (v2 / "cpu.stat").write_text("usage_usec 10\nnr_periods 31\nnr_throttled 30\nthrottled_usec 2500000\n")
    assert cpu_quota.quota_of(v2) == cpu_quota.Quota(5000, 100000)
    assert cpu_quota.counters(v2) == {"nr_periods": 31, "nr_throttled": 30, "throttled_ns": 2_500_000_000}
    (v2 / "cpu.max").write_text("max 100000\n")
    assert cpu_quota.quota_of(v2) is None
    v1 = tmp_path / "v1"
    v1.mkdir()
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert cpu_quota.quota_of(v1) is None
    (v1 / "cpu.cfs_quota_us").write_text("25000\n")
    (v1 / "cpu.stat").write_text("nr_periods 10\nnr_throttled 4\nthrottled_time 123456789\n")
    assert cpu_quota.quota_of(v1).cpus() == 0.25
    assert cpu_quota.counters(v1)["throttled_ns"] == 123456789


def _row(**kw):
    return {"cgroup": "/pp-x-cpu-server", "roles": ["backend"], "quota_us": 5000, "period_us": 100000, "cpus": 0.05,
            "seconds": 3.0, "nr_periods": 30, "nr_throttled": 30, "throttled_ns": 2_400_000_000, **kw}


def test_the_cross_check_judges_one_thread_and_shows_several():
    out = {"tps": 3000.0, "clients": 1, "stages": [{"name": "throttled.backend", "us_per_txn": 280.0}]}
    (r,) = quota_check([_row()], out)
    assert r["cgroup_throttled_share"] == 0.8 and r["probes_throttled_share"] == 0.84 and r["agrees"]
    (r,) = quota_check([_row()], {**out, "stages": [{"name": "throttled.backend", "us_per_txn": 100.0}]})
    assert r["agrees"] is False and "DISAGREE" in quota_note(r)
    (r,) = quota_check([_row()], {**out, "clients": 16})
    assert "agrees" not in r and "per CPU" in quota_note(r)


def test_the_cause_names_the_cgroup_of_the_throttled_process():
    runs = [{"cpu_quotas": [_row()]}, {"cpu_quotas": [_row(cgroup="/other", roles=["pgbench"])]}]
    text = cause_detail(runs, ["throttled.backend"])
    assert "/pp-x-cpu-server" in text and "5 ms per 100 ms" in text and "/other" not in text
    assert cause_detail(runs, ["runqueue.backend"]) is None
