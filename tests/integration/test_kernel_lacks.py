"""The fallbacks an older kernel takes, tried on this one (PATHPROF_KERNEL_LACKS, agent/probing/hooks.py): a kernel
before 6.2 loads pathprof-compat.bpf.o (kernel fields through bpf_probe_read_kernel instead of the bpf_rdonly_cast
kfunc), and one before 5.16 has no bpf_skc_to_unix_sock (a unix socket's peer: the code that needs it is dead, set
before load). Both must load, keep every stage of the unix path and close; the run must say what it lacked and that
the lack was pretended. The guests prove the same on real old kernels (test_kernel_guest.py, bench/kernels)."""
import json
import os
from pathlib import Path

import pytest
from conftest import run_pathprof

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(os.geteuid() != 0, reason="loads BPF: root only")]
CLOSURE_PCT = 5.0


def test_compat_object_without_the_unix_peer_helper_loads_keeps_the_stages_and_closes(tmp_path):
    env = dict(os.environ, PATHPROF_KERNEL_LACKS="bpf_rdonly_cast,skc_to_unix_sock")
    cp = run_pathprof("run", "--topology", "unix", "--clients", "2", "--duration", "3", "--trace-sample", "4",
                      "--json", env=env, runs_dir=tmp_path / "runs")
    assert cp.returncode == 0, cp.stderr[-3000:]
    doc = json.loads(cp.stdout)
    hooks = doc["probe_hooks"]
    assert hooks["object"] == "pathprof-compat.bpf.o"
    assert hooks["pretended"] == ["bpf_rdonly_cast", "skc_to_unix_sock"]
    assert [d["feature"] for d in hooks["degraded"]] == ["unix stream peer"]
    notes = json.loads((Path(doc["run_dir"]) / "run.json").read_text())["probes"]["notes"]
    assert any(n.startswith("unix stream peer: this kernel lacks bpf_skc_to_unix_sock") for n in notes), notes
    stages = {s["name"] for s in doc["stages"]}
    assert {"wakeup.backend", "recv.backend", "backend.execute", "recv.pgbench", "client.pgbench"} <= stages, stages
    lat, cpu = doc["closure"]["latency_error_pct"], doc["closure"]["cpu_error_pct"]
    assert abs(lat) <= CLOSURE_PCT and abs(cpu) <= CLOSURE_PCT, f"closure latency {lat} %, CPU {cpu} %"
    # the same kernel taken as it is: the main object, nothing degraded or pretended
    cp = run_pathprof("run", "--topology", "unix", "--clients", "2", "--duration", "2", "--json",
                      env={k: v for k, v in os.environ.items() if k != "PATHPROF_KERNEL_LACKS"},
                      runs_dir=tmp_path / "runs")
    assert cp.returncode == 0, cp.stderr[-3000:]
    hooks = json.loads(cp.stdout)["probe_hooks"]
    assert hooks["object"] == "pathprof.bpf.o" and hooks["degraded"] == [] and "pretended" not in hooks
