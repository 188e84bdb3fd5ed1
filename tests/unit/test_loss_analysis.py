"""Packet-loss figures that need no kernel: the retransmission summary, its sentence, and the cause."""
from pathprof.analysis.causes import cause_of
from pathprof.analysis.report.render import retransmit_line
from pathprof.analysis.summary import tcp_retransmits


def test_retransmissions_summed_by_leg_and_their_wait_as_a_share():
    counts = [{"leg": "request", "kind": "probe", "sender": "pgbench", "count": 9},
              {"leg": "response", "kind": "rto", "sender": "backend", "count": 1}]
    stages = [{"name": "retx_probe.backend", "leg": "request", "us_per_txn": 900.0},
              {"name": "retx_rto.pgbench", "leg": "response", "us_per_txn": 60.0},
              {"name": "wire.backend", "leg": "request", "us_per_txn": 40.0},
              {"name": "backend.lock_wait", "leg": "server", "us_per_txn": 5.0, "parent": "backend.execute"}]
    r = tcp_retransmits(counts, stages, txns=100)
    assert r["count"] == 10 and r["per_txn"] == 0.1
    assert r["wait_us_per_txn"] == 960.0 and r["wait_share_pct"] == 96.0
    line = retransmit_line({**r, "kernel_retrans_segs": 11})
    assert "9 on the request leg" in line and "1 after a timeout" in line and "kernel counted 11" in line


def test_loss_stages_are_their_own_cause():
    assert cause_of("retx_rto.backend", set()) == "packet loss"
    assert cause_of("retx_probe.pgbench", {"pgbouncer"}) == "packet loss"
