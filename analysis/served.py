"""Which backend served which transaction (#22), from the sampled spans of `--trace-sample` (traces.parquet).

Every message of a transaction carries its transaction number through each process (probes: each receive passes
it to the next send, and a hop's held request keeps it until the hop forwards it), so a complete sampled chain
(analysis.report.waterfall) runs from pgbench through each hop to whichever server process executed it. Through a
transaction pooler (pgbouncer in transaction mode) one pooler process hands a client's transactions to several
server connections; through pgpool each child keeps one backend. `served_by` in the run document says, per
backend, how many sampled transactions it served and through which hop processes, and lists the first
transactions with their backend: the answer to "which server connection served this transaction"."""
from __future__ import annotations

from collections import Counter

from pathprof.analysis.client import client_of
from pathprof.analysis.rundir import RunDir

MAX_SPANS = 100_000      # chaining is a Python walk (~5 µs a span with the chains built, every report pays it):
                         # the earliest ~20k transactions are enough to say which backends served them
LISTED = 20              # transactions listed one by one in the document; the traces hold every one


def _hop_pids(txn: dict, backend_roles: set[str]) -> dict[str, int]:
    """{hop: pid} of the hop processes that worked on the transaction: the pid of a span that is not a wire trip
    (a wire span carries its sender's pid), on a row that is neither the client nor a backend."""
    out: dict[str, int] = {}
    for s in txn["spans"]:
        if s["pid"] is None or s["stage"].startswith("wire.") or s["role"] in backend_roles:
            continue
        out.setdefault(s["role"], int(s["pid"]))
    return out


def served_by(traces, client: str = "pgbench") -> dict | None:
    """{transactions, backends: [{pid, transactions, via: {hop: [pids]}}], listed: [{txn, backend_pid,
    via: {hop: pid}}], spans_read, spans} or None when no sampled transaction is complete."""
    from pathprof.analysis.report.waterfall import transactions
    if traces is None or not len(traces):
        return None
    spans = len(traces)
    if spans > MAX_SPANS:
        traces = traces.nsmallest(MAX_SPANS, "ts_ns")
    txns = [t for t in transactions(traces) if t["backend_pid"] is not None]
    if not txns:
        return None
    per = Counter(t["backend_pid"] for t in txns)
    via: dict[int, dict[str, set]] = {}
    listed = []
    for t in sorted(txns, key=lambda t: t["t0_ns"]):
        hops = _hop_pids(t, {client, "backend"})
        for hop, pid in hops.items():
            via.setdefault(t["backend_pid"], {}).setdefault(hop, set()).add(pid)
        if len(listed) < LISTED:
            listed.append({"txn": t.get("txn"), "backend_pid": t["backend_pid"], "via": hops})
    backends = [{"pid": pid, "transactions": n,
                 "via": {h: sorted(p) for h, p in sorted(via.get(pid, {}).items())}}
                for pid, n in per.most_common()]
    return {"transactions": len(txns), "backends": backends, "listed": listed, "spans_read": len(traces),
            "spans": spans}


def add_served_by(out: dict, rd: RunDir) -> None:
    if not rd.file("traces.parquet").exists():
        return
    doc = served_by(rd.read_frame("traces.parquet"), client_of(rd.run))
    if doc:
        out["served_by"] = doc


def describe(doc: dict) -> str:
    """One line for the report."""
    n = doc["transactions"]
    tops = ", ".join(f"{b['pid']} {100.0 * b['transactions'] / n:.0f} %" + _via(b) for b in doc["backends"][:6])
    more = f", {len(doc['backends']) - 6} more" if len(doc["backends"]) > 6 else ""
    part = (f" (of the first {doc['spans_read']:,} of {doc['spans']:,} sampled spans)"
            if doc["spans_read"] < doc["spans"] else "")
    return (f"Sampled transactions followed to the backend that served them: {n:,}{part}, served by "
            f"{len(doc['backends'])} backend(s): {tops}{more} (JSON served_by lists transactions one by one)")


def _via(b: dict) -> str:
    if not b["via"]:
        return ""
    return " via " + "; ".join(f"{hop} {', '.join(str(p) for p in pids[:4])}" + ("…" if len(pids) > 4 else "")
                               for hop, pids in b["via"].items())
