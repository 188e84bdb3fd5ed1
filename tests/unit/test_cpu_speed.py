"""The machine's speed sample (agent.host.cpu_speed): what a run records beside its load, and how two are read."""
import json
import time

import jsonschema
import pytest
from pathprof.agent.host import cpu_speed
from pathprof.analysis.schemas import load as load_schema
from pathprof.analysis.speed import SAMPLED_KINDS, sampled_ratio, sampled_speed


def test_a_sample_times_every_kind_of_work():
    s = cpu_speed.sample(tries=2)
    assert set(cpu_speed.KINDS) | {"interp_median"} == set(SAMPLED_KINDS) and set(SAMPLED_KINDS) <= set(s)
    assert s["interp_median"] >= s["interp"]                 # the median try is never faster than the best
    assert all(s[k] > 0 for k in cpu_speed.KINDS)
    # each kind is a real amount of work: a unit takes more than a nanosecond and less than a millisecond
    assert all(1 < s[k] < 1e6 for k in cpu_speed.KINDS)


def test_a_sample_fits_run_json_schema():
    schema = load_schema("run")
    sub = schema["$defs"]["cpu_speed_sample"]
    jsonschema.validate(json.loads(json.dumps(cpu_speed.sample(tries=1))), sub)


def test_ratio_is_how_much_slower_the_second_ran():
    def host(during, interp=50.0):
        return {"cpu_speed": {"before": {"interp": interp, "hash": 1000.0, "memory": 2000.0},
                              "during": {"hash": during, "samples": 40}}}
    a, b = host(2000.0), host(2400.0, interp=60.0)
    assert sampled_ratio(a, b) == pytest.approx(1.2)             # the CPUs through the load
    assert sampled_ratio(a, b, "interp") == pytest.approx(1.2)   # a sample beside it, asked for by name
    assert sampled_ratio(a, None) is None                        # a run recorded before the samples existed
    assert sampled_ratio({"cpu_speed": {"before": {"interp": 50.0}}}, b) is None   # no sample through its load
    # two machines' samples are two CPUs, not one machine's drift
    assert sampled_ratio({**a, "hostname": "db1"}, {**b, "hostname": "db2"}) is None
    assert sampled_ratio({**a, "hostname": "db1"}, {**b, "hostname": "db1"}) == pytest.approx(1.2)


def test_a_runs_speed_is_the_mean_of_its_samples():
    host = {"cpu_speed": {"before": {"interp": 50.0, "hash": 1000.0, "memory": 2000.0},
                          "after": {"interp": 70.0, "hash": 1200.0, "memory": 2000.0},
                          "during": {"hash": 1500.0, "samples": 12}}}
    assert sampled_speed(host) == {"interp": 60.0, "hash": 1100.0, "memory": 2000.0, "during": 1500.0}
    assert sampled_speed({}) is None
    one = {"cpu_speed": {"before": {"interp": 50.0, "hash": 1.0, "memory": 2.0}}}
    assert sampled_speed(one)["interp"] == 50.0          # a run whose load failed has no sample after it


def test_the_watch_samples_every_cpu_through_the_load():
    w = cpu_speed.SpeedWatch(period_s=0.05).start()
    time.sleep(0.6)
    got = w.stop()
    assert got["samples"] >= len(w.cpus) * 3 and set(got["per_cpu"]) == {str(c) for c in w.cpus}
    assert min(got["per_cpu"].values()) <= got["hash"] <= max(got["per_cpu"].values())
    assert cpu_speed.SpeedWatch(period_s=10).start().stop() is None    # stopped before its first sample
