"""doctor on this machine, and doctor failing cleanly when a capability is taken away."""
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_doctor_all_required_present():
    from pathprof.agent.probing import doctor
    caps = doctor.check_capabilities()
    assert not doctor.missing(caps, "basic"), [c for c in caps if c.required and not c.ok]
    names = {c.name for c in caps}
    assert {"root", "btf", "tracefs", "tp_btf", "netfilter links", "usdt notes", "kvm"} <= names
    assert "pathprof doctor" in doctor.render_capabilities(caps)
    assert not [l for l in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
                if l.startswith("pp-doctor-")]


SCRIPT = r"""
import json, subprocess, sys
# in a private mount namespace: take tracefs (and the rest of /sys/kernel) away, read-only
subprocess.run(["umount", "-l", "/sys/kernel/tracing"], capture_output=True)
subprocess.run(["mount", "-t", "tmpfs", "-o", "ro", "none", "/sys/kernel"], check=True)
from pathprof.agent.probing import doctor
from pathprof.errors import RequirementError
caps = doctor.check_capabilities()
try:
    doctor.require("basic")
    print(json.dumps({"raised": None}))
except RequirementError as e:
    print(json.dumps({"raised": str(e), "tracefs": [c.ok for c in caps if c.name == "tracefs"][0]}))
"""


def test_doctor_fails_cleanly_without_btf():
    """/sys/kernel hidden: no BTF (what tp_btf and CO-RE need) and no tracefs (which nothing basic needs)."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    cp = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable, "-c", SCRIPT],
                        capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stderr[-2000:]
    out = json.loads(cp.stdout.strip().splitlines()[-1])
    assert out["raised"] and "btf" in out["raised"] and "tracefs" not in out["raised"]
    assert out["tracefs"] is False
    assert "Traceback" not in cp.stderr
    # the real machine is untouched
    assert os.path.isdir("/sys/kernel/tracing/events")
