"""The connection probe counts what happens on the run's path only (#19: any load on the machine). Its SYN and
SYN-ACK retransmission counters used to match sockets by the service port alone, so another PostgreSQL of the
machine on 5432 (a container's, another run's) added its retransmissions to the run's and to the kernel check's
left side. Ground truth built here: a namespace that is not the path's, where a client's SYNs to port 5432 are
dropped (iptables, inside that namespace only) and retransmitted all through a clean -C run on the nic path, whose
own handshakes never wait."""
import json
import os
import subprocess
import sys

import pytest
from conftest import run_pathprof

pytestmark = pytest.mark.integration
FOREIGN = "pp-foreign-syn"


def _ns(*argv, check=True):
    return subprocess.run(["ip", "netns", "exec", FOREIGN, *argv], capture_output=True, text=True, check=check)


# connects to 127.0.0.2:5432 inside FOREIGN, whose SYNs are dropped: each retransmits them (1 s, 2 s later) until
# its 2.5 s timeout, then the next begins; bounded (timeout 60), ended by the test; prints how many it began
DROPPED_SYNS = """
import signal, socket, sys
n = 0
signal.signal(signal.SIGTERM, lambda *a: (print(n, flush=True), sys.exit(0)))
while True:
    s = socket.socket()
    s.settimeout(2.5)
    n += 1
    try:
        s.connect(("127.0.0.2", 5432))
    except OSError:
        pass
    s.close()
"""


def test_retransmissions_in_another_namespace_on_the_same_port_are_not_the_runs(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root")
    subprocess.run(["ip", "netns", "add", FOREIGN], check=True)
    loop = None
    try:
        _ns("ip", "link", "set", "lo", "up")
        _ns("iptables", "-w", "-A", "INPUT", "-p", "tcp", "--dport", "5432", "-j", "DROP")
        loop = subprocess.Popen(["ip", "netns", "exec", FOREIGN, "timeout", "60", sys.executable, "-c",
                                 DROPPED_SYNS], stdout=subprocess.PIPE, text=True)
        cp = run_pathprof("run", "--topology", "nic", "--clients", "2", "--connect", "--duration", "4",
                          "--probe-duty", "100", "--json", "--no-live", runs_dir=tmp_path / "runs")
    finally:
        if loop is not None:
            loop.terminate()
            began = loop.communicate(timeout=10)[0].strip()
        subprocess.run(["ip", "netns", "del", FOREIGN], check=False)
    assert cp.returncode == 0, cp.stderr[-3000:]
    assert int(began or 0) >= 3, began    # the foreign SYNs were retransmitted all along the run (2.5 s each)
    doc = json.loads(cp.stdout)
    c = doc["connection_probe"]["counters"]
    r = doc["connect_retransmits"] if "connect_retransmits" in doc else {"kernel_syn_retrans": 0}
    # the path's own handshakes: no loss on the nic wire, the listen queue keeps up with 2 clients
    assert r.get("kernel_syn_retrans", 0) == 0, r
    assert c["syn_retransmits"] == 0 and c["synack_retransmits"] == 0, c
    assert not any(s["name"] == "connect.syn_retx" for s in doc["connection_setup"]), doc["connection_setup"]
