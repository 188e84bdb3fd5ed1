"""The TCP message markers of --trace-sample (PP_ST_XSEND/XRECV in the trace ring buffer): read into
messages.parquet with the socket's tuple and sequence number, and kept out of the span table."""
import socket
import struct

from pathprof.agent.probing.bpf import layout as L
from pathprof.agent.probing.frames import message_frame, trace_frame


def _ip(text: str) -> int:
    return struct.unpack("<I", socket.inet_aton(text))[0]    # as the kernel stores it (network order) read LE


def _rec(stage: str, **kw) -> bytes:
    sid = next(k for k, v in L.STAGES.items() if v == stage)
    return bytes(L.Trace(stage=sid, **kw))


def test_markers_become_messages_and_stay_out_of_the_spans():
    send = _rec("xsend", ts=100, pid=7, tid=8, seq=3, role=L.ROLES["pgbench"], leg=1, laddr=_ip("198.18.21.1"),
                raddr=_ip("198.18.21.2"), lport=51322, rport=15432, tcp_seq=4_000_000_000)
    recv = _rec("xrecv", ts=90, pid=9, tid=9, seq=3, role=L.ROLES["pgbench"], leg=3, laddr=_ip("198.18.21.1"),
                raddr=_ip("198.18.21.2"), lport=51322, rport=15432, tcp_seq=17)
    span = _rec("wire", ts=50, dur=5, pid=1, tid=1, seq=4, role=L.ROLES["backend"], leg=1)
    m = message_frame([send, recv, span], {})
    assert list(m["dir"]) == ["recv", "send"]               # sorted by time; the span is not a message
    row = m.iloc[1].to_dict()
    assert (row["local_ip"], row["local_port"], row["remote_ip"], row["remote_port"]) == \
        ("198.18.21.1", 51322, "198.18.21.2", 15432)
    assert row["tcp_seq"] == 4_000_000_000 and row["txn"] == 3 and row["role"] == "pgbench"
    spans = trace_frame([send, recv, span], {})
    assert list(spans["stage"]) == ["wire.backend"]
    assert len(message_frame([span], {})) == 0 and len(trace_frame([send], {})) == 0
