"""CPU accounting keeps the time of threads that exit during the run (they are summed per role in per-CPU
arrays as they run: nothing is left to fold, or to lose, when a thread goes away)."""
import os
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.integration


def test_exited_threads_keep_their_cpu_time():
    if os.geteuid() != 0:
        pytest.skip("needs root")
    from pathprof.agent.probing import frames as F
    from pathprof.agent.probing.session import ProbeConfig, ProbeSession
    s = ProbeSession(ProbeConfig(level="basic", netns=[None], service_ports=[5999], window_s=0))
    s.start()
    try:
        # a tracked parent whose children (followed in the kernel at fork) each burn ~0.2 s of CPU and exit
        burn = "import time\nend = time.process_time() + 0.2\nwhile time.process_time() < end: pass"
        # the parent prints its children's CPU as the kernel counted it (the figure a failure is read against)
        parent = subprocess.Popen([sys.executable, "-c",
                                   f"import resource, subprocess, sys, time\ntime.sleep(0.5)\n"
                                   f"for _ in range(4): subprocess.run([sys.executable, '-c', {burn!r}])\n"
                                   f"r = resource.getrusage(resource.RUSAGE_CHILDREN)\nprint(r.ru_utime + r.ru_stime)"],
                                  stdout=subprocess.PIPE, text=True)
        s.track(parent.pid, "other")
        s.reset()
        s.open_window()
        t0 = time.monotonic()
        children_s = float(parent.communicate(timeout=60)[0])
        now = F.collect(s.main)
        cpu = F.cpu_frame(now, s._base, s.hops)
        stats = F.read_stats(s.main)
        s.close_window()
    finally:
        s.close()
    other = cpu[cpu.role == "other"].ns.sum() / 1e9
    # 4 x 0.2 s burnt by threads now gone. Once in a CI run (2026-11-26) 0.74 s, not reproduced in 18 runs here
    # (alone, beside two CPU hogs, beside a loopback pgbench): the message says what the kernel and probes saw
    why = (other, children_s, cpu.groupby("role").ns.sum().to_dict(), {k: v for k, v in stats.items() if v})
    assert 0.8 <= other <= (time.monotonic() - t0) * 2, why
