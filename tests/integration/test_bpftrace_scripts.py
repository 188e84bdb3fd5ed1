"""The companion bpftrace scripts in probes/bt/ parse, attach and stop cleanly on this kernel."""
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
BT = sorted((Path(__file__).resolve().parents[2] / "probes" / "bt").glob("*.bt"))


@pytest.mark.parametrize("script", BT, ids=lambda p: p.name)
def test_script_attaches_and_ends_on_sigint(script):
    if os.geteuid() != 0 or not shutil.which("bpftrace"):
        pytest.skip("needs root and bpftrace")
    p = subprocess.Popen(["bpftrace", str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    head, deadline = [], time.time() + 90
    try:
        # bpftrace handles Ctrl-C only once its probes are attached: wait for that line first
        while time.time() < deadline:
            line = p.stdout.readline()
            if not line:
                break
            head.append(line)
            if line.startswith("Attaching"):
                break
        rest = None
        for _ in range(40):                # bpftrace prints its maps and exits 0 on Ctrl-C; a Ctrl-C that
            time.sleep(0.5)                # lands while it still attaches is lost, so send another
            p.send_signal(signal.SIGINT)
            try:
                rest, _ = p.communicate(timeout=2)
                break
            except subprocess.TimeoutExpired:
                continue
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    out = "".join(head) + (rest or "")
    m = re.search(r"Attaching (\d+) probes", out)
    assert m and int(m.group(1)) > 0, out[-2000:]
    # the only error bpftrace may print here is its RLIMIT_MEMLOCK notice (memcg accounting needs no rlimit)
    errors = [line for line in out.splitlines() if line.startswith("ERROR") and "RLIMIT_MEMLOCK" not in line]
    assert not errors and p.returncode == 0, out[-2000:]
