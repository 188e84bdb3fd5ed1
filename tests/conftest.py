import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PATHPROF = [str(ROOT / ".venv" / "bin" / "pathprof")] if (ROOT / ".venv/bin/pathprof").exists() else \
    [sys.executable, "-m", "pathprof.agent.cli"]


def machine_state() -> dict:
    """What teardown must restore: namespaces, links, and the root namespace's iptables rules."""
    def out(cmd):
        return subprocess.run(cmd, capture_output=True, text=True).stdout
    links = sorted(re.findall(r"^\d+: ([^:@]+)[:@]", out(["ip", "-o", "link", "show"]), re.M))
    rules = [l for l in out(["iptables-save"]).splitlines() if not l.startswith("#")]
    rules = [re.sub(r"\[\d+:\d+\]", "", l) for l in rules]
    netns = sorted(l.split()[0] for l in out(["ip", "netns", "list"]).splitlines() if l.strip())
    # Developers running several test sessions at once can hide each other's objects; CI sets nothing.
    ignore = os.environ.get("PATHPROF_TEST_IGNORE")
    if ignore:
        netns = [n for n in netns if not re.match(ignore, n)]
        links = [n for n in links if not re.match(ignore, n)]
    loops = sorted(l for l in out(["losetup", "-a"]).splitlines() if "pathprof" in l)
    mounts = sorted(l.split()[1] for l in open("/proc/mounts").read().splitlines() if "pathprof" in l)
    cgroups = sorted(str(p) for pat in ("pp-*", "*/pp-*") for p in Path("/sys/fs/cgroup").glob(pat) if p.is_dir())
    return {"netns": netns, "links": links, "iptables": rules, "loops": loops, "mounts": mounts, "cgroups": cgroups}


def run_pathprof(*args, timeout=300, check=False, **kw) -> subprocess.CompletedProcess:
    env = dict(kw.pop("env", os.environ))
    env["PATHPROF_RUNS"] = str(kw.pop("runs_dir", env.get("PATHPROF_RUNS", "/tmp/pp-test-runs")))
    cp = subprocess.run([*PATHPROF, *args], capture_output=True, text=True, timeout=timeout, env=env,
                        stdin=subprocess.DEVNULL, **kw)
    if check and cp.returncode != 0:
        raise AssertionError(f"pathprof {' '.join(args)} exited {cp.returncode}:\n{cp.stderr[-3000:]}")
    return cp


@pytest.fixture
def runs_dir(tmp_path):
    return tmp_path / "runs"


def pytest_collection_modifyitems(config, items):
    if os.geteuid() == 0:
        return
    skip = pytest.mark.skip(reason="integration tests need root")
    for item in items:
        if "integration" in item.keywords:
            item.add_marker(skip)
