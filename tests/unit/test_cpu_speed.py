"""The machine's speed through a run (agent.host.cpu_speed): what a run records of its CPUs, and how two are read."""
import json
import os
import time

import jsonschema
import pytest
from pathprof.agent.host import cpu_speed
from pathprof.analysis.schemas import load as load_schema
from pathprof.analysis.speed import sampled_ratio


def test_the_watch_fits_run_json_schema():
    w = cpu_speed.SpeedWatch(period_s=0.05).start()
    time.sleep(0.3)
    sub = load_schema("run")["properties"]["host"]["properties"]["cpu_speed"]
    jsonschema.validate({"during": json.loads(json.dumps(w.stop()))}, sub)


def test_ratio_is_how_much_slower_the_second_ran():
    def host(during):
        return {"cpu_speed": {"during": {"hash": during, "samples": 40}}}
    a, b = host(2000.0), host(2400.0)
    assert sampled_ratio(a, b) == pytest.approx(1.2)             # the CPUs through the load
    assert sampled_ratio(a, None) is None                        # a run recorded before the samples existed
    assert sampled_ratio({"cpu_speed": {}}, b) is None           # a run whose load failed before a sample
    # two machines' samples are two CPUs, not one machine's drift
    assert sampled_ratio({**a, "hostname": "db1"}, {**b, "hostname": "db2"}) is None
    assert sampled_ratio({**a, "hostname": "db1"}, {**b, "hostname": "db1"}) == pytest.approx(1.2)


def test_the_watch_samples_every_cpu_through_the_load():
    w = cpu_speed.SpeedWatch(period_s=0.05).start()
    # waited for, not slept on: a round's pause grows with its own CPU time (MAX_DUTY), so a slow or busy CPU
    # samples less often in a given time (ci49a-3: 4 samples in 0.6 s beside the other lane's run)
    deadline = time.monotonic() + 15.0
    while time.monotonic() < deadline and min(len(v) for v in w.samples.values()) < 3:
        time.sleep(0.05)
    got = w.stop()
    assert got["samples"] >= len(w.cpus) * 3 and set(got["per_cpu"]) == {str(c) for c in w.cpus}
    assert min(got["per_cpu"].values()) <= got["hash"] <= max(got["per_cpu"].values())
    assert cpu_speed.SpeedWatch(period_s=10).start().stop() is None    # stopped before its first sample


def test_the_watch_waits_longer_on_a_slow_cpu(monkeypatch):
    # a CPU ~50x slower (a TCG guest): each round of samples costs more, and the watch keeps to MAX_DUTY of one CPU
    real = cpu_speed.hashlib.blake2b

    def slow(data):
        t = time.thread_time_ns()
        while time.thread_time_ns() - t < 20_000_000:     # 20 ms of this thread's CPU per hash
            pass
        return real(data)
    monkeypatch.setattr(cpu_speed.hashlib, "blake2b", slow)
    w = cpu_speed.SpeedWatch(cpus={min(os.sched_getaffinity(0))}, period_s=0.01).start()
    time.sleep(1.0)
    got = w.stop()
    # one round is 60 ms of CPU: then the watch waits 12 s, not 10 ms (at 10 ms, about 14 rounds in the second)
    assert got["samples"] == 1, got
