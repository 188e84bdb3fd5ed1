"""pathprof on Debian 12's own kernel (6.1), inside a qemu guest booted on it (topologies/guest/kernel_guest.py): a
probed unix run must load (the kernel lacks the sk_data_ready / sock_*_length / tcp_sendmsg_locked tracepoints, the
bpf_rdonly_cast kfunc and BPF netfilter links), say which hooks it used instead, and close within ±5 %; and a CPU
quota on cgroup v2, throttled at wakeup as kernels before 6.18 do, must be its own stage and agree with cpu.stat.

Real parts only: the guest image (built once, ~1-2 min, cached under /var/cache/pathprof/kernel-guest/), Debian's
kernel, this checkout mounted inside, a real PostgreSQL and pgbench. Under TCG (this machine's KVM cannot boot a
real guest) the boot with its three runs takes ~160 s on one vCPU, most of it emulated set-up (2026-11-28: runs of
46, 49, 42 s with the checkout's pages cached in the guest, 52, 71, 67 s without).
"""
import json
import os
from pathlib import Path

import premise
import pytest
from conftest import run_pathprof
from truth import record

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
# 6 s of load: the window's programs took 3 s to attach in the emulated guest beside the other lane (CI 2026-11-27),
# and a 3-s run's window then opened 0.75 s before pgbench ended and held no stage
# Then a CPU quota on cgroup v2 (this VM runs v1), on a kernel that throttles a group's threads at their wakeup
# (before 6.18): the same 1-client loopback run, always on, without and with the server's cgroup at 5 ms per 100 ms
# (#35.1). One boot for all three: each boot costs ~40 s of emulated start-up.
# Each run goes through the premise the host's runs do (tests/premise.py): a run whose latency view misses its
# closure by more than CLOSURE_PCT, or that held no transaction in a window, is made again once inside the guest
# (its first try kept as NAME.try1.json, and the remake said at the session's end). CI ci43c/ci43e: the unix run's
# one window held no transaction twice in six rounds, and a capped run closed at +68.6 % once with 51 transactions
# in its window (+-0.1 % in four other runs).
CHECK = ("{py} -c 'import json,sys; d=json.load(open(sys.argv[1])); e=(d.get(\"closure\") or {{}})"
         ".get(\"latency_error_pct\"); w=(d.get(\"windows\") or {{}}).get(\"txns_in\"); "
         "sys.exit(0 if e is not None and abs(e) <= {pct} and w != 0 else 1)' /pp-out/{name}.json")
RUN = ("try() {{ {pathprof} run {args} --json > /pp-out/{name}.json 2> /pp-out/{name}.err; echo $? > "
       "/pp-out/{name}.rc; }}; try; if [ \"$(cat /pp-out/{name}.rc)\" = 0 ] && ! " + CHECK + "; then "
       "mv /pp-out/{name}.json /pp-out/{name}.try1.json; try; fi\n")
QUOTA = "--topology loopback --clients 1 --duration 4 --probe-duty 100"


def _commands(pathprof: str, py: str) -> str:
    def run(name, args):
        return RUN.format(pathprof=pathprof, py=py, pct=premise.CLOSURE_PCT, name=name, args=args)
    return ("export PATHPROF_RUNS=/pp-out/runs\nuname -r > /pp-out/kernel\n" + run("qbase", QUOTA)
            + run("qcapped", QUOTA + " --cpu-quota server=5/100")
            + run("run", "--topology unix --clients 2 --duration 6"))


@pytest.fixture(scope="module")
def guest():
    if os.geteuid() != 0:
        pytest.skip("needs root (loop mount, chroot, qemu)")
    from pathprof.topologies.guest.kernel_guest import KernelGuest
    g = KernelGuest("bookworm")
    g.ensure()                     # built with its progress on stderr, once per machine; a lock serialises builders
    return g


@pytest.fixture(scope="module")
def booted(guest, tmp_path_factory):
    """The guest booted once on Debian 12's kernel, every command run: (its result, the output directory)."""
    out = tmp_path_factory.mktemp("kernel-guest") / "out"
    r = guest.run(_commands(str(ROOT / ".venv/bin/pathprof"), str(ROOT / ".venv/bin/python")), out, ROOT,
                  timeout_s=1200)
    return r, out


def _doc(booted, name: str) -> dict:
    r, out = booted
    err = (out / f"{name}.err").read_text(errors="replace") if (out / f"{name}.err").exists() else ""
    rc = (out / f"{name}.rc").read_text().strip() if (out / f"{name}.rc").exists() else str(r.rc)
    assert rc == "0" and (out / f"{name}.json").exists(), (
        f"guest run {name} failed (rc {rc}, guest {r.rc} in {r.seconds:.0f} s); guest kernel: {r.kernel_complaints}\n"
        f"{r.output[-3000:]}\n{err[-3000:]}\n{r.console[-2000:]}")
    assert (out / "kernel").read_text().startswith("6.1."), "not Debian 12's kernel"
    first = out / f"{name}.try1.json"
    if first.exists() and not (out / f"{name}.noted").exists():
        d = json.loads(first.read_text())
        why = (f"closure latency {(d.get('closure') or {}).get('latency_error_pct')} %, "
               f"{(d.get('windows') or {}).get('txns_in')} transactions in its windows")
        premise.note_remake("closure", f"guest run {name}: {why}", d.get("run_dir"))
        (out / f"{name}.noted").write_text("")
    return json.loads((out / f"{name}.json").read_text())


def test_probed_unix_run_on_debian_12_kernel_loads_through_fallback_hooks_and_closes(booted):
    doc = _doc(booted, "run")
    assert doc["tps"] > 0 and doc["status"] == "complete"
    hooks = doc["probe_hooks"]
    assert hooks["object"] == "pathprof-compat.bpf.o"          # no bpf_rdonly_cast before 6.2
    ways = {e["event"]: e for e in hooks["events"]}
    assert ways["sk_data_ready"]["hook"] == "fentry sock_def_readable"
    assert ways["sk_data_ready"]["refused"][0]["hook"] == "tp_btf sk_data_ready"
    assert ways["sock_recv"]["hook"] == "fexit inet_recvmsg+unix_stream_recvmsg"
    assert ways["sock_send"]["hook"] == "fexit inet_sendmsg+unix_stream_sendmsg"
    assert ways["nf_begin"]["hook"] == "fentry nf_hook_slow"   # no BPF netfilter links before 6.4
    stages = {s["name"] for s in doc["stages"]}
    assert {"wakeup.backend", "recv.backend", "backend.execute", "client.pgbench"} <= stages, stages
    # the response leg: pgbench slept for it (recv) or, on one vCPU, found it queued when it ran again (queued)
    assert stages & {"recv.pgbench", "queued.pgbench"}, stages
    lat, cpu = doc["closure"]["latency_error_pct"], doc["closure"]["cpu_error_pct"]
    assert abs(lat) <= 5 and abs(cpu) <= 5, f"closure latency {lat} %, CPU {cpu} %"


def _stage(doc, name) -> float:
    return sum(s["us_per_txn"] for s in doc["stages"] if s["name"] == name and not s.get("parent"))


def test_a_cpu_quota_on_cgroup_v2_is_a_stage_checked_against_cpu_stat(booted):
    """#35.1 on cgroup v2 and on the wakeup-time throttling of kernels before 6.18 (this VM: v1, 6.18). First
    measured (bench/guest_quota, 2026-11-28): cpu.stat 76-81 % of the time throttled, the probes 104-111 % of the
    cycle before a backend's start-up exchange with pgbench was left out of the stages."""
    base, capped = _doc(booted, "qbase"), _doc(booted, "qcapped")
    (q,) = capped["cpu_quotas"]
    assert q["version"] == 2 and q["roles"] == ["backend"], q
    assert q["quota_us"] == 5000 and q["period_us"] == 100000 and q["nr_throttled"] >= 0.5 * q["nr_periods"] > 0, q
    record("guest v2: probes / cpu.stat throttled share", q["probes_throttled_share"] / q["cgroup_throttled_share"],
           "0.65 ... 1.5")
    assert q["agrees"], q
    gap = capped["closure"]["cycle_us"] - base["closure"]["cycle_us"]
    throttled = _stage(capped, "throttled.backend")
    record("guest v2: throttled / gap", throttled / gap, ">= 0.7")
    assert throttled >= 0.7 * gap > 0, (throttled, gap, capped["stages"])
    record("guest v2: capped closure", capped["closure"]["latency_error_pct"], "|x| <= 10")
    assert abs(capped["closure"]["latency_error_pct"]) <= 10, (capped["closure"], capped["stages"])
    assert not any(s["name"].startswith("throttled.") for s in base["stages"]), base["stages"]
    # the explanation, made here from the guest's run directories: one cause, the quota, with its cgroup
    d = json.loads(run_pathprof("diff", base["run_dir"].replace("/pp-out", str(booted[1]), 1),
                                capped["run_dir"].replace("/pp-out", str(booted[1]), 1), "--json", check=True).stdout)
    top = d["explanations"][0]["causes"][0]
    assert top["name"] == "cpu quota" and "throttled.backend" in top["items"], d["explanations"][0]["causes"]
    assert q["cgroup"] in top["detail"] and "5 ms per 100 ms" in top["detail"], top
