"""Ground truth inside the server: known I/O changes land in the backend's I/O stages (--probes deep)."""
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import truth
from conftest import PATHPROF, machine_state, run_pathprof

pytestmark = pytest.mark.integration
STATE = "/var/lib/pathprof"


def _fsync_us() -> float:
    """What one fsync of a small write costs on the disk pathprof's servers live on (best of 5)."""
    os.makedirs(STATE, exist_ok=True)
    path = os.path.join(STATE, f".pp-fsync-probe-{os.getpid()}")
    best = float("inf")
    try:
        with open(path, "wb") as f:
            for _ in range(5):
                f.write(b"x" * 8192)
                t0 = time.perf_counter()
                f.flush()
                os.fsync(f.fileno())
                best = min(best, (time.perf_counter() - t0) * 1e6)
    finally:
        os.unlink(path)
    return best


def _run(runs_dir, *extra, clients: int = 2, duration: int = 2) -> dict:
    cp = run_pathprof("run", "--topology", "loopback", "--clients", str(clients), "--duration", str(duration),
                      "--script", "tpcb-like",
                      "--probes", "deep", "--probe-duty", "100", "--json", *extra, runs_dir=runs_dir, check=True,
                      timeout=600)
    doc = json.loads(cp.stdout)
    return {s["name"]: s["us_per_txn"] for s in doc["stages"]} | {"_doc": doc}


def _wal_waits(run: dict) -> float:
    """The backend's waits on the WAL's device: its own flush, the WAL writer's lock, a dirty buffer's WAL flush,
    full WAL buffers (the same device's queue)."""
    return sum(run.get(n, 0.0) for n in ("backend.wal_flush", "backend.lwlock_wait", "backend.dirty_write",
                                         "backend.wal_buffers_full"))


def test_fsync_off_removes_the_wal_flush_wait(runs_dir):
    if _fsync_us() < 50:
        pytest.skip("fsync is nearly free on this disk: nothing for fsync=off to remove")
    before = machine_state()
    on = _run(runs_dir, "--pg-set", "fsync=on")
    off = _run(runs_dir, "--pg-set", "fsync=off")
    assert machine_state() == before
    assert on["backend.wal_flush"] > 50, on
    # backend.execute's parts are exclusive: they add up to it (other is what they leave), and the waits and I/O
    # alone never exceed it (nested waits are not counted twice)
    split = on["_doc"]["closure"]["execute_split"]
    assert split["other_raw_us"] > -0.03 * split["execute_us"], split
    parts = [s for s in on["_doc"]["stages"] if s.get("part")]
    assert {"backend.wal_flush", "backend.execute.other"} <= {s["name"] for s in parts}, parts
    assert sum(s["us_per_txn"] for s in parts) == pytest.approx(on["backend.execute"], rel=0.03), parts
    assert all(s["us_per_txn"] <= s["inclusive_us"] + 0.01 for s in parts if "inclusive_us" in s), parts
    assert off.get("backend.wal_flush", 0.0) < 0.2 * on["backend.wal_flush"], (on, off)
    for st in ("wire.backend", "wire.pgbench"):          # the network stages stay about where they were
        assert abs(on[st] - off[st]) < 50, (st, on[st], off[st])
    # the disk agrees: a cache flush per commit with fsync on, (almost) none with it off
    def flushes(run):
        return sum(d["requests_per_txn"] for d in run["_doc"]["disk"] if d["op"] == "flush")
    assert flushes(on) > 0.5 and flushes(off) < 0.1, (on["_doc"]["disk"], off["_doc"]["disk"])
    # pgbench -r: the commit (END) is where tpcb-like pays for the flush
    end = [s for s in on["_doc"]["scripts"][0]["statements"] if s["sql"].startswith("END")]
    assert end and end[0]["latency_ms"] * 1000 > 0.5 * on["backend.wal_flush"] / 2, end


def test_data_larger_than_shared_buffers_is_read_block_by_block(runs_dir):
    """select-only on a table that fits in shared_buffers reads nothing from the kernel once warm; on five times
    the rows with 16 MB of shared_buffers most lookups miss and read a block (backend.data_read)."""
    def reads(*extra):
        cp = run_pathprof("run", "--topology", "unix", "--clients", "2", "--duration", "2", "--script", "select-only",
                          "--probes", "deep", "--probe-duty", "100", "--json", *extra, runs_dir=runs_dir, check=True,
                          timeout=600)
        st = {s["name"]: s for s in json.loads(cp.stdout)["stages"]}
        return st.get("backend.data_read", {}).get("count_per_txn", 0.0)
    fits = reads("--scale", "1", "--pg-set", "shared_buffers=128MB")
    misses = reads("--scale", "5", "--pg-set", "shared_buffers=16MB")    # ~75 MB of accounts
    assert fits < 0.05, fits
    assert misses > 0.3, misses


def test_wal_device_too_small_is_refused_before_anything_is_built(runs_dir):
    before = machine_state()
    cp = run_pathprof("run", "--wal-device", "10", "--probes", "off", "--duration", "2", runs_dir=runs_dir)
    assert cp.returncode == 2 and "at least 64 MB" in cp.stderr and "Traceback" not in cp.stderr
    assert machine_state() == before and not (runs_dir.exists() and any(runs_dir.iterdir()))


def test_a_throttled_wal_device_grows_the_wal_flush_by_what_the_limit_implies(runs_dir):
    """The WAL on a loop device of its own (its flushes seen there), then on the same kind of device throttled to
    200 writes/s (the cgroup block I/O throttle): 1 client, so each commit's writes wait their turn. The throttle
    counts k requests per transaction; at 200/s the cycle cannot be shorter than k/200 s, and the throttle lets
    a request go early by whatever the rest of the cycle already took, so wal_flush should grow by about k/200 s
    minus the unthrottled cycle. The wait is in the throttle's queue, before a block request exists: not the
    device's time. The network stages stay where they were; the cgroup is gone afterwards."""
    before = machine_state()
    base = _run(runs_dir, "--wal-device", "128", clients=1, duration=3)         # ~100 throttled commits a second
    slow = _run(runs_dir, "--wal-device", "128", "--wal-device-limit", "wiops=200", clients=1, duration=3)
    assert machine_state() == before       # the loop devices, their files, mounts and the cgroup are gone
    # --wal-device alone: the WAL's writes and flushes land on a loop device of its own (seen by the disk view)
    base_meta = json.loads((Path(base["_doc"]["run_dir"]) / "run.json").read_text())
    base_dev = base_meta["postgres"]["wal_device"]["device"].rsplit("/", 1)[1]          # e.g. loop0
    flush = {d["device"]: d["requests_per_txn"] for d in base["_doc"]["disk"] if d["op"] == "flush"}
    assert flush.get(base_dev, 0) > 0.5, base["_doc"]["disk"]
    meta = json.loads((Path(slow["_doc"]["run_dir"]) / "run.json").read_text())
    wal = meta["postgres"]["wal_device"]
    txns = meta["pgbench"]["result"]["transactions"]
    k = wal["throttled"]["writes"] / txns
    assert 1.0 <= k <= 4.0, wal                    # a commit's WAL write and its cache flush (+ the WAL writer's)
    implied_us = k / 200 * 1e6
    base_cycle_us, slow_cycle_us = 1e6 / base["_doc"]["tps"], 1e6 / slow["_doc"]["tps"]
    # The lower bound is the throttle's: k requests at 200/s. The upper one is the throttle with no credit at all: a
    # request waits its 1/200 s after the previous one's dispatch, and the device's time and the rest of the cycle
    # come on top when they outlast that spacing. The rest is the unthrottled cycle, or the throttled run's cycle
    # beside its WAL waits when the machine slowed it. 10 trials beside the other lane: 1.00 x k/200 s; once in CI
    # (stop 49's fresh clone) 1.32, over the 1.25 x k/200 s this bound was before it took the rest in
    stages = {n: (round(base.get(n, 0.0)), round(slow.get(n, 0.0))) for n in {*base, *slow} - {"_doc"}}
    slow_dev = wal["device"].rsplit("/", 1)[1]
    device_us = sum(d["us_per_txn"] for d in slow["_doc"]["disk"] if d["device"] == slow_dev)
    rest_us = max(base_cycle_us, slow_cycle_us - _wal_waits(slow))
    no_credit_us = implied_us + device_us + rest_us
    truth.record("cycle_over_implied", slow_cycle_us / implied_us, "0.8 < x")
    truth.record("cycle_over_no_credit", slow_cycle_us / no_credit_us, "x < 1.25")
    assert 0.8 * implied_us < slow_cycle_us < 1.25 * no_credit_us, \
        (k, implied_us, device_us, base_cycle_us, rest_us, slow_cycle_us, stages)
    # What the throttle added to the cycle is in the backend's waits on the WAL device, wal_flush first. Judged
    # against the cycle's own growth. 8 trials beside the other lane's load: wal_flush took 0.92-1.0 of it. Once in
    # CI (f8d044a) only 0.57, with a base cycle of 5.2 ms (wal_flush 2.5 ms of it; the rest ~3x the usual) and the
    # rest of the throttled cycle 4.8 ms: the rest of the cycle grew too. The waits a commit may meet on the WAL's
    # device besides its own flush (the WAL writer holding WALWriteLock, a dirty buffer's WAL flush, full WAL
    # buffers) are the same device's queue; together with wal_flush they must carry the growth
    grew = slow["backend.wal_flush"] - base["backend.wal_flush"]
    waits_grew = _wal_waits(slow) - _wal_waits(base)
    expected = slow_cycle_us - base_cycle_us
    truth.record("wal_flush_growth_over_cycle_growth", grew / expected, "x > 0.5")
    truth.record("wal_waits_growth_over_cycle_growth", waits_grew / expected, "0.7 < x < 1.25")
    truth.record("base_cycle_us", base_cycle_us, "")
    # The base run's own disturbance can go the other way too (fresh-clone CI with --wipe, ci41w round 1: a 4.3-ms
    # unthrottled cycle whose WAL waits were under 1 ms, then a throttled one whose rest was back to ~1.7 ms): the
    # waits then grew by the cycle's growth plus what the rest of the cycle gave back, which is no WAL time
    gave_back = max(0.0, (base_cycle_us - _wal_waits(base)) - (slow_cycle_us - _wal_waits(slow)))
    context = (grew, waits_grew, expected, gave_back, base_cycle_us, slow_cycle_us, k, stages)
    assert 0.7 * expected < waits_grew < 1.25 * expected + gave_back, context
    assert grew > 0.5 * expected, context
    for st in ("wire.backend", "wire.pgbench"):
        assert abs(slow[st] - base[st]) < 50, (st, base[st], slow[st])
    # Were the throttle's wait device time, the loop device's time would grow by all of `grew`. It grows by far
    # less: only as the disk under the loop file slows with other load (on a shared machine that alone can
    # double it between two runs, hence the margin)
    def device_us(run):
        dev = json.loads((Path(run["_doc"]["run_dir"]) / "run.json").read_text())["postgres"]["wal_device"]["device"]
        return sum(d["us_per_txn"] for d in run["_doc"]["disk"] if d["device"] == dev.rsplit("/", 1)[1])
    assert device_us(slow) - device_us(base) < 0.6 * grew, (device_us(base), device_us(slow), grew)


@pytest.mark.parametrize("args, words", [
    (["--wal-device-limit", "wiops=200"], "needs --wal-device"),
    (["--wal-device", "128", "--wal-device-limit", "wiops=fast"], "takes a whole number"),
    (["--wal-device", "128", "--wal-device-limit", "latency=5ms"], "is not one of riops"),
])
def test_bad_wal_device_limits_are_refused_before_anything_is_built(runs_dir, args, words):
    before = machine_state()
    cp = run_pathprof("run", "--probes", "off", "--duration", "2", *args, runs_dir=runs_dir)
    assert cp.returncode == 2 and words in cp.stderr and "Traceback" not in cp.stderr, cp.stderr
    assert len(cp.stderr.strip().splitlines()) == 1, cp.stderr
    assert machine_state() == before and not (runs_dir.exists() and any(runs_dir.iterdir()))


def test_a_killed_throttled_run_is_undone_by_its_journal(runs_dir):
    """SIGKILL while the server runs inside its pp- cgroup: the journal (replayed here for this run only, as
    `pathprof cleanup` would) moves the processes out, removes the cgroup, the mount and the loop device."""
    from pathprof.agent.host.journal import JOURNAL_DIR, Journal
    before = machine_state()
    env = dict(os.environ, PATHPROF_RUNS=str(runs_dir))
    p = subprocess.Popen([*PATHPROF, "run", "--topology", "unix", "--clients", "1", "--duration", "30", "--script",
                          "tpcb-like", "--probes", "off", "--wal-device", "128", "--wal-device-limit", "wiops=100"],
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not any(runs_dir.glob("*/pgbench/argv.txt")):
            time.sleep(0.3)
        time.sleep(1.5)
        runs = list(runs_dir.glob("*"))
        assert runs, "the run never started"
        found = [d / f"pp-{runs[0].name}" for d in (Path("/sys/fs/cgroup/blkio"), Path("/sys/fs/cgroup"))
                 if (d / f"pp-{runs[0].name}").exists()]          # cgroup v1 blkio, else v2
        assert found, "no pp- cgroup for the run"
        cg = found[0]
        assert cg.exists() and (cg / "cgroup.procs").read_text().split(), "the server is not in its cgroup"
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    journal = JOURNAL_DIR / f"{runs[0].name}.jsonl"
    assert cg.exists() and journal.exists(), "a SIGKILLed run cannot tear down; its objects stay"
    assert Journal.load(journal).teardown() == []
    assert not cg.exists() and machine_state() == before
