"""pathprof on Debian 12's own kernel (6.1), inside a qemu guest booted on it (topologies/guest/kernel_guest.py): a
probed unix run must load (the kernel lacks the sk_data_ready / sock_*_length / tcp_sendmsg_locked tracepoints, the
bpf_rdonly_cast kfunc and BPF netfilter links), say which hooks it used instead, and close within ±5 %.

Real parts only: the guest image (built once, ~1-2 min, cached under /var/cache/pathprof/kernel-guest/), Debian's
kernel, this checkout mounted inside, a real PostgreSQL and pgbench. Under TCG (this machine's KVM cannot boot a
real guest) the test takes ~55 s on one vCPU (2026-11-27), most of it emulated set-up.
"""
import json
import os
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
# 6 s of load: the window's programs took 3 s to attach in the emulated guest beside the other lane (CI 2026-11-27),
# and a 3-s run's window then opened 0.75 s before pgbench ended and held no stage
COMMANDS = """export PATHPROF_RUNS=/pp-out/runs
uname -r > /pp-out/kernel
{pathprof} run --topology unix --clients 2 --duration 6 --json > /pp-out/run.json 2> /pp-out/run.err
"""


@pytest.fixture(scope="module")
def guest():
    if os.geteuid() != 0:
        pytest.skip("needs root (loop mount, chroot, qemu)")
    from pathprof.topologies.guest.kernel_guest import KernelGuest
    g = KernelGuest("bookworm")
    g.ensure()                     # built with its progress on stderr, once per machine; a lock serialises builders
    return g


def test_probed_unix_run_on_debian_12_kernel_loads_through_fallback_hooks_and_closes(guest, tmp_path):
    r = guest.run(COMMANDS.format(pathprof=ROOT / ".venv/bin/pathprof"), tmp_path / "out", ROOT, timeout_s=600)
    err = (tmp_path / "out/run.err").read_text(errors="replace") if (tmp_path / "out/run.err").exists() else ""
    assert r.rc == 0, (f"guest commands failed (rc {r.rc}, {r.seconds:.0f} s); guest kernel: {r.kernel_complaints}\n"
                       f"{r.output[-3000:]}\n{err[-3000:]}\n{r.console[-2000:]}")
    assert (tmp_path / "out/kernel").read_text().startswith("6.1."), "not Debian 12's kernel"
    doc = json.loads((tmp_path / "out/run.json").read_text())
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
