"""OTLP trace and span ids of sampled transactions, derived from what every host sees identically.

A transaction's trace id is a hash of its **client connection's wire tuple and the TCP sequence number of its
request's first byte**:

    trace_id = SHA-256("pathprof-otlp/1|<client ip>:<port>><server ip>:<port>|<tcp seq>")[:16]   (128 bits)

- The tuple is the connection as it crosses the wire between the hosts, client side first. A host's agent
  learns it from the message markers of `--trace-sample` (messages.parquet: the socket's own tuple at each
  sampled send start and delivery) and, where NAT stands between its socket and the wire, from run.json
  `scope.leaving_connections` (conntrack's translation: a client side's `wire_local > wire_remote`, a server
  side's `wire_remote > wire_local`), exactly as `pathprof merge` joins hosts (pathprof.analysis.merge).
- The sequence number is the request's first byte: the client's `write_seq` at its send start, the server's
  `copied_seq` when the request is delivered. NAT does not rewrite it; every host on the path reads the same.
- The anchor of a transaction is the earliest request-leg marker among its spans' starts (a marker's ts is its
  message's send start or delivery, where the span of that message starts, with the same transaction number):
  on the client's host pgbench's send, on the server's host the backend's delivery. Both give one trace id.

The root span's id is derived from the trace id alone, so the host that holds the client's part (pgbench's
spans: the transaction's start and end) sends it, and every other host parents its own spans under the same
id without talking to it. A stage span's id hashes the trace id, the host, the stage, its start and its thread.

A transaction with no marker (AF_UNIX or IPv6 connections, markers lost) gets a **local** trace id, from the run
id, the host and its first span; it is exported all the same but joins nothing (attribute
`pathprof.trace_id.source` = "local", else "wire").

Limits: a sequence number repeats after 4 GiB on one connection, and a tuple is reused by a later connection
with another random initial sequence number, so a collision needs both at once. A hop on a host of its own
(a pooler between two hosts) opens its own connection upstream: the hosts beyond it derive their trace ids from
that connection, not the client's, so their spans form a trace of their own.
"""
from __future__ import annotations

import hashlib

import pandas as pd
from pathprof.analysis.run_model import RunMeta

ID_SCHEME = "pathprof-otlp/1"


def _h(text: str, nbytes: int) -> int:
    v = int.from_bytes(hashlib.sha256(text.encode()).digest()[:nbytes], "big")
    return v or 1                        # 0 is the invalid id in OTLP


def trace_id(conn: str, tcp_seq: int) -> int:
    """128-bit trace id of the transaction whose request starts at `tcp_seq` on the client connection `conn`
    ("client_ip:port>server_ip:port" on the wire)."""
    return _h(f"{ID_SCHEME}|{conn}|{int(tcp_seq) & 0xFFFFFFFF}", 16)


def local_trace_id(run_id: str, host: str, tid: int, txn: int, ts_ns: int) -> int:
    """A trace id for a transaction no marker names: unique to this run's export, joins nothing."""
    return _h(f"{ID_SCHEME}|local|{run_id}|{host}|{tid}|{txn}|{ts_ns}", 16)


def root_span_id(tid: int) -> int:
    """The root span's 64-bit id, from the trace id alone (every host derives the same)."""
    return _h(f"{ID_SCHEME}|root|{tid:032x}", 8)


def host_span_id(tid: int, host: str) -> int:
    """The span a host without the client's part hangs its stages under (its parent is the root)."""
    return _h(f"{ID_SCHEME}|host|{tid:032x}|{host}", 8)


def span_id(tid: int, host: str, stage: str, ts_ns: int, thread: int) -> int:
    return _h(f"{ID_SCHEME}|span|{tid:032x}|{host}|{stage}|{ts_ns}|{thread}", 8)


def wire_map(meta: dict | RunMeta) -> dict[str, str]:
    """Socket tuple "local>remote" -> the client connection on the wire "client>server", for this host's
    connections that leave it (run.json scope.leaving_connections; empty for a run on one machine)."""
    out = {}
    for c in RunMeta.of(meta or {}).scope.leaving_connections:
        if not c.wire_local or not c.wire_remote:
            continue
        key = f"{c.local}>{c.remote}"
        out[key] = (f"{c.wire_local}>{c.wire_remote}" if c.side == "client"
                    else f"{c.wire_remote}>{c.wire_local}")
    return out


def client_conn(dir_: str, local: str, remote: str, wires: dict[str, str]) -> str:
    """The client connection on the wire of a request-leg marker: a send's socket is the client's end
    (local > remote), a delivery's the server's (remote > local); NAT translated through `wires`."""
    hit = wires.get(f"{local}>{remote}")
    if hit:
        return hit
    return f"{local}>{remote}" if dir_ == "send" else f"{remote}>{local}"


class Anchors:
    """A host's markers (messages.parquet), looked up by (ts_ns, txn): the start of a span that begins where its
    message is sent or delivered. A request's marker names its transaction at once; a response's names it
    through the request marker of the same socket and transaction number (a client's agent whose chain starts at
    the response's delivery: the request's wire belongs to the other host)."""

    def __init__(self, messages: pd.DataFrame | None, meta: dict | RunMeta):
        self._at: dict[tuple[int, int], tuple[str, int]] = {}
        self._req: dict[tuple[str, int], tuple[str, int, int | None]] = {}
        if messages is None or not len(messages):
            return
        wires = wire_map(meta)
        for r in messages.itertuples(index=False):
            sock, txn = f"{r.local_ip}:{r.local_port}>{r.remote_ip}:{r.remote_port}", int(r.txn)
            self._at.setdefault((int(r.ts_ns), txn), (sock, txn))
            if r.leg == "request":
                conn = client_conn(r.dir, f"{r.local_ip}:{r.local_port}", f"{r.remote_ip}:{r.remote_port}", wires)
                self._req.setdefault((sock, txn), (conn, int(r.tcp_seq), int(r.ts_ns) if r.dir == "send" else None))

    def __len__(self) -> int:
        return len(self._at)

    def find(self, starts: list[tuple[int, int]]) -> tuple[str, int, int | None] | None:
        """(client conn, request tcp_seq, the request's send start when this host sent it) of the earliest span
        start (ts_ns, txn) a marker names, else None."""
        for key in sorted(starts):
            at = self._at.get(key)
            hit = self._req.get(at) if at else None
            if hit is not None:
                return hit
        return None
