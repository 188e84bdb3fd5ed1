"""`pathprof merge`: several hosts' runs of one path joined into one run directory.

Each input is a run recorded by one host's agent (`pathprof attach`, with --netns where hosts are namespaces of
one kernel, and --trace-sample so it has message markers): its run.json `scope` names the host and lists the
connections that leave it, with the tuple they carry on the wire beyond its NAT (agent/discovery/edge.py).

1. Connections are matched across hosts by those wire tuples: a client side's (wire_local, wire_remote) is the
   server side's (wire_remote, wire_local), through NAT on either side.
2. Messages are matched by connection and TCP sequence number (messages.parquet: one marker per sampled
   message where it leaves its sender, send start, and where it reaches its receiver, socket ready). A
   request gives d_ab = server recv - client send, a response d_ba = client recv - server send.
3. The two hosts' clock offset is estimated from those trips (pathprof.analysis.clock_offset), ± its bound.
4. The wire between the hosts becomes a stage per direction, `wire.<receiver>` on its leg, exactly as one
   agent over the whole path measures it (the sender's send start -> the receiver's socket ready; the
   netfilter and device time each host measured inside it is carved out by the latency view as usual):
   the mean corrected trip (never negative: each is >= the bound) times the receiver's deliveries per
   transaction. The hosts' own stages keep their legs; each host's tables are scaled to the same number
   of transactions, since the agents did not start and stop at the same instant.

The result is a normal run directory (schema pathprof-run/1.x): report, compare, diff and export read it.
run.json adds `hosts`, `clock_offsets` [{host_a, host_b, offset_us, bound_us, ...}] and `links`; wire.parquet
holds the matched trips; traces.parquet every host's spans on the first host's clock, with a `host` column;
cpu.parquet every host's CPU components with their host, closing against the machines' busy time
(pathprof.analysis.merge_cpu).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from pathprof.analysis.clock_offset import InconsistentClocks, LinearOffset, drift, fit
from pathprof.analysis.histogram import HIST_SLOTS
from pathprof.analysis.rundir import RunDir
from pathprof.errors import UserError

DELIVERY_KINDS = ("wakeup", "idle_exit", "queued")   # one of these per message a receiver consumed


class Host:
    """One input run: its host name, leaving connections, stages and message markers."""

    def __init__(self, path: Path, shift_ns: int = 0, drift_ppm: float = 0.0):
        self.rd = RunDir.open(path)
        m = self.rd.meta
        scope = m.get("scope")
        if not scope or not scope.get("host"):
            raise UserError(f"{path} was not recorded by a host's agent (run.json has no `scope`): record each host "
                            "with `pathprof attach` (--netns NAME where hosts are namespaces)")
        self.name = scope["host"]
        self.conns = scope.get("leaving_connections") or []
        self.stages = self.rd.read_frame("stages.parquet")
        self.messages = self.rd.read_frame("messages.parquet")
        if self.messages is None:
            raise UserError(f"{path} ({self.name}) has no message markers (messages.parquet): attach each host with "
                            "--trace-sample N (the same N on every host)")
        self.shift_ns, self.drift_ppm = int(shift_ns), float(drift_ppm)
        self.shift_from = int(self.messages["ts_ns"].min()) if len(self.messages) else 0
        self.messages = self.messages.assign(ts_ns=self.shifted(self.messages["ts_ns"]))
        # what the probe tables are divided by, as the report divides them: attach's observed exchanges, or a
        # pgbench-driven run's (run --dsn) transactions inside the measurement windows
        from pathprof.analysis.summary import _basis
        basis = _basis(self.rd.run, {"notes": []})
        self.txns = int(basis["txns"] or 0)
        if not self.txns or self.stages is None:
            raise UserError(f"{path} ({self.name}) measured no exchanges: nothing to merge")
        self.tps = basis["tps"] or None
        self.busy_ns, self.elapsed_ns = basis["busy"], basis["elapsed"]
        self.busy_source, self.busy_tick_ns = basis.get("busy_source", "tick"), basis.get("busy_tick")
        self.connections = (m.get("workload") or {}).get("clients") or len(self.conns)

    def shifted(self, ts_ns: pd.Series) -> pd.Series:
        """--shift/--drift: this host's clock moved by shift_ns at its first marker, running drift_ppm fast."""
        if not self.shift_ns and not self.drift_ppm:
            return ts_ns
        extra = self.shift_ns + self.drift_ppm * 1e-6 * (ts_ns.astype(float) - self.shift_from)
        return (ts_ns + extra).round().astype("int64")


def match_connections(hosts: list[Host]) -> list[dict]:
    """Links between hosts: [{client, server (Host), pairs [(client conn, server conn)]}] by wire tuples."""
    by_wire = {}
    for h in hosts:
        for c in h.conns:
            if c["side"] == "server":
                by_wire[(c["wire_remote"], c["wire_local"])] = (h, c)
    links: dict[tuple, dict] = {}
    for h in hosts:
        for c in h.conns:
            if c["side"] != "client":
                continue
            hit = by_wire.get((c["wire_local"], c["wire_remote"]))
            if hit is None or hit[0] is h:
                continue
            link = links.setdefault((h.name, hit[0].name), {"client": h, "server": hit[0], "pairs": []})
            link["pairs"].append((c, hit[1]))
    return list(links.values())


def _sock_key(df: pd.DataFrame) -> pd.Series:
    return (df["local_ip"] + ":" + df["local_port"].astype(str) + ">" + df["remote_ip"] + ":" +
            df["remote_port"].astype(str))


def trips(link: dict) -> pd.DataFrame:
    """Every sampled message of the link seen on both hosts: dir (request: client -> server, response), conn
    (the client side's wire tuple), tcp_seq, send_ns (sender's clock), recv_ns (receiver's clock), receiver."""
    cm, sm = link["client"].messages, link["server"].messages
    cmap = {f"{c['local']}>{c['remote']}": f"{c['wire_local']}>{c['wire_remote']}" for c, _ in link["pairs"]}
    smap = {f"{s['local']}>{s['remote']}": f"{c['wire_local']}>{c['wire_remote']}" for c, s in link["pairs"]}
    cm = cm.assign(conn=_sock_key(cm).map(cmap)).dropna(subset=["conn"])
    sm = sm.assign(conn=_sock_key(sm).map(smap)).dropna(subset=["conn"])
    out = []
    for d, sender, receiver in (("request", cm, sm), ("response", sm, cm)):
        s = sender[sender["dir"] == "send"][["conn", "tcp_seq", "ts_ns"]].drop_duplicates(["conn", "tcp_seq"])
        r = receiver[receiver["dir"] == "recv"][["conn", "tcp_seq", "ts_ns", "role"]]
        r = r.drop_duplicates(["conn", "tcp_seq"])
        j = s.merge(r, on=["conn", "tcp_seq"], suffixes=("_send", "_recv"))
        out.append(pd.DataFrame({"dir": d, "conn": j["conn"], "tcp_seq": j["tcp_seq"], "send_ns": j["ts_ns_send"],
                                 "recv_ns": j["ts_ns_recv"], "receiver": j["role"]}))
    return pd.concat(out, ignore_index=True)


def hist_of(values_ns, scale: float = 1.0) -> np.ndarray:
    """The log-linear histogram (analysis.histogram) of these values, each counted `scale` times."""
    h = np.zeros(HIST_SLOTS, dtype=np.int64)
    for v in np.asarray(values_ns, dtype=np.int64):
        v = max(int(v), 0)
        if v < 4:
            i = v
        else:
            o = v.bit_length() - 1
            i = (o - 1) * 4 + ((v >> (o - 2)) - 4)
        h[min(i, HIST_SLOTS - 1)] += 1
    return np.rint(h * scale).astype(np.int64)


def _receiver_cols(host: Host, receiver: str) -> tuple[str, str]:
    """(role, hop) of a marker's receiver name in the host's stage table (a hop's markers carry its name)."""
    st = host.stages
    hop = st[st["hop"] == receiver]
    return (str(hop["role"].iloc[0]), receiver) if len(hop) else (receiver, "")


def wire_rows(host: Host, leg: str, receiver: str, corrected_ns: np.ndarray, n: int) -> dict:
    """A stages.parquet row for the wire into `receiver` on `host`: its per-message mean times the receiver's
    deliveries per transaction, for n transactions."""
    role, hop = _receiver_cols(host, receiver)
    st = host.stages
    sel = st[(st["kind"].isin(DELIVERY_KINDS)) & (st["role"] == role) & (st["hop"] == hop) & (st["leg"] == leg)]
    per_txn = sel["count"].sum() / host.txns if len(sel) else 1.0
    count = int(round(per_txn * n))
    return {"kind": "wire", "role": role, "hop": hop, "leg": leg, "hook": "", "netns": "", "dev": "",
            "count": count, "sum_ns": int(round(float(np.mean(corrected_ns)) * count)),
            "hist": hist_of(corrected_ns, count / len(corrected_ns))}


MACHINE_WIDE_KINDS = ("block",)     # every request the machine completed, whichever host's agent saw it


def scaled_stages(host: Host, n: int, drop: set, machine_seen: bool = False) -> pd.DataFrame:
    """The host's stage rows scaled to n transactions; its own unpaired wire rows replaced by the merged ones
    (drop: (role, hop, leg)); netfilter rows of an unnamed namespace named after the host; the machine-wide rows
    left out when another host of its machine has them already (machine_seen)."""
    st = host.stages.copy()
    keep = ~st.apply(lambda r: r["kind"] == "wire" and (r["role"], r["hop"], r["leg"]) in drop, axis=1)
    if machine_seen:
        keep &= ~st["kind"].isin(MACHINE_WIDE_KINDS)
    st = st[keep].copy()
    f = n / host.txns
    st["count"] = (st["count"] * f).round().astype("int64")
    st["sum_ns"] = (st["sum_ns"] * f).round().astype("int64")
    st["hist"] = [None if h is None else np.rint(np.asarray(h, dtype=float) * f).astype(np.int64) for h in st["hist"]]
    nf = st["kind"].isin(("netfilter", "nf_all")) & st["netns"].isin(("", "root"))
    st.loc[nf, "netns"] = host.name
    return st.assign(host=host.name)


def order_hosts(hosts: list[Host], links: list[dict]) -> list[Host]:
    """Clients first, then the hosts they connect to, in chain order."""
    rank = {h.name: 0 for h in hosts}
    for _ in hosts:
        for lk in links:
            rank[lk["server"].name] = max(rank[lk["server"].name], rank[lk["client"].name] + 1)
    return sorted(hosts, key=lambda h: rank[h.name])


def estimate(link: dict, t: pd.DataFrame) -> dict:
    """The link's clock model (server's clock minus client's: an Offset, or a LinearOffset when the trips show
    drift) with its bound, as run.json's clock_offsets entry; "_offset" carries the model."""
    req, rsp = t[t["dir"] == "request"], t[t["dir"] == "response"]
    a, b = link["client"].name, link["server"].name
    ts_ab, d_ab = req["send_ns"], req["recv_ns"] - req["send_ns"]       # times on the client's clock
    ts_ba, d_ba = rsp["recv_ns"], rsp["recv_ns"] - rsp["send_ns"]
    try:
        o = fit(ts_ab, d_ab, ts_ba, d_ba)
    except InconsistentClocks as e:
        raise UserError(f"the trips between {a} and {b} contradict each other ({e}): a clock jumped during the "
                        "runs, or the runs are not of the same traffic") from None
    except ValueError:
        raise UserError(f"{a} and {b} share connections but no sampled message was seen on both both ways "
                        f"({len(req)} requests, {len(rsp)} responses matched): record both with the same "
                        "--trace-sample N, at the same time") from None
    linear = isinstance(o, LinearOffset)
    d = None if linear else drift(ts_ab, d_ab, ts_ba, d_ba, segments=4)
    out = {"host_a": a, "host_b": b, "offset_us": round(o.offset_ns / 1e3, 3), "bound_us": round(o.bound_ns / 1e3, 3),
           "samples_ab": o.n_ab, "samples_ba": o.n_ba,
           "drift_ppm": round(o.ppm, 3) if linear else (None if d is None else round(d.ppm, 3)),
           "constant_offset_fits": not linear, "drift_applied": linear, "_offset": o}
    if linear:      # offset_us is θ at the trips' middle; θ at the first and the last trip
        ends = [min(ts_ab.min(), ts_ba.min()), max(ts_ab.max(), ts_ba.max())]
        out["offset_span_us"] = [round(float(o.theta(x)) / 1e3, 3) for x in ends]
    return out


def correct(o, leg: str, part: pd.DataFrame) -> np.ndarray:
    """The link's trips of one leg, corrected by its clock model: request = client -> server (send times on the
    client's clock), response = server -> client (receive times on the client's clock)."""
    d = part["recv_ns"] - part["send_ns"]
    if leg == "request":
        return o.corrected_ab(d, part["send_ns"])
    return o.corrected_ba(d, part["recv_ns"])


def load_hosts(dirs: list[Path], shifts: dict, drifts: dict) -> list[Host]:
    """The hosts' runs, each named once, with --shift/--drift applied to the hosts they name."""
    if len(dirs) < 2:
        raise UserError("merge needs the runs of at least two hosts")
    hosts = [Host(Path(d)) for d in dirs]
    seen: dict[str, Path] = {}
    for h in hosts:
        if h.name in seen:
            raise UserError(f"two runs of the same host {h.name}: {seen[h.name]} and {h.rd.path} (merge joins "
                            "different hosts' runs of one path)")
        seen[h.name] = h.rd.path
    for opt, named in (("--shift", shifts), ("--drift", drifts)):
        unknown = set(named) - set(seen)
        if unknown:
            raise UserError(f"{opt} names no host of these runs: {', '.join(sorted(unknown))} (hosts: "
                            f"{', '.join(seen)})")
    return [Host(h.rd.path, shifts.get(h.name, 0), drifts.get(h.name, 0.0)) if h.name in shifts or h.name in drifts
            else h for h in hosts]


def to_client_clock(o, to_first):
    """A server host's timestamps -> the first host's clock, through its link's model o (θ(t) = server's clock
    minus the client's at the client's time t) and the client host's own mapping."""
    def conv(ts):
        ts = np.asarray(ts, dtype=float)
        return to_first(ts - o.theta(ts - o.offset_ns))
    return conv


def join_link(lk: dict, n: int, to_first: dict) -> tuple[list, set, dict, dict, pd.DataFrame]:
    """One link's trips, clock model, wire rows and document: (rows, the receivers' rows they replace,
    clock_offsets entry, links entry, wire trips). Adds the server host's clock mapping to `to_first`."""
    t = trips(lk)
    est = estimate(lk, t)
    o = est.pop("_offset")
    to_first.setdefault(lk["server"].name, to_client_clock(o, to_first[lk["client"].name]))
    doc = {"client_host": lk["client"].name, "server_host": lk["server"].name,
           "connections": [{"client": {"local": c["local"], "remote": c["remote"], "nat": c["nat"]},
                            "server": {"local": s["local"], "remote": s["remote"], "nat": s["nat"]},
                            "wire": f"{c['wire_local']} -> {c['wire_remote']}"} for c, s in lk["pairs"]],
           "wire": {}}
    rows, drops, wires = [], set(), []
    for leg, recv_host in (("request", lk["server"]), ("response", lk["client"])):
        part = t[t["dir"] == leg]
        for receiver, g in part.groupby("receiver"):
            c = correct(o, leg, g)
            row = wire_rows(recv_host, leg, receiver, c, n)
            rows.append({**row, "host": f"{lk['client'].name}<->{lk['server'].name}"})
            drops.add((recv_host.name, row["role"], row["hop"], leg))
            doc["wire"][leg] = {"receiver": receiver, "messages": len(g), "mean_us": round(float(c.mean()) / 1e3, 3),
                                "min_us": round(float(c.min()) / 1e3, 3)}
        wires.append(part.assign(wire_ns=np.round(correct(o, leg, part)).astype("int64"),
                                 client_host=lk["client"].name, server_host=lk["server"].name))
    return rows, drops, est, doc, pd.concat(wires, ignore_index=True)


def merge(dirs: list[Path], out: Path | None, runs_root: Path, shifts: dict | None = None,
          drifts: dict | None = None) -> RunDir:
    """Join the hosts' runs into one run directory (at `out`, else a new one under runs_root)."""
    hosts = load_hosts(dirs, shifts or {}, drifts or {})
    links = match_connections(hosts)
    if not links:
        raise UserError("no common connections: no connection leaving one of these hosts arrives at another "
                        f"({', '.join(f'{h.name}: {len(h.conns)} leaving' for h in hosts)})")
    linked = {lk["client"].name for lk in links} | {lk["server"].name for lk in links}
    if linked != {h.name for h in hosts}:
        raise UserError(f"{', '.join(sorted({h.name for h in hosts} - linked))} shares no connection with the "
                        "other hosts")
    hosts = order_hosts(hosts, links)
    first = hosts[0]
    n = first.txns
    rows, drops, offsets, link_docs, wires = [], set(), [], [], []
    to_first = {first.name: lambda ts: np.asarray(ts, dtype=float)}
    for lk in sorted(links, key=lambda x: hosts.index(x["client"])):    # a client's clock mapping comes first
        r, d, est, doc, w = join_link(lk, n, to_first)
        rows += r
        drops |= d
        offsets.append(est)
        link_docs.append(doc)
        wires.append(w)
    from pathprof.analysis.merge_cpu import machine_of
    machines = [machine_of(h) for h in hosts]
    frames = [scaled_stages(h, n, {x[1:] for x in drops if x[0] == h.name}, machines[i] in machines[:i])
              for i, h in enumerate(hosts)] + [pd.DataFrame(rows)]
    stages = pd.concat(frames, ignore_index=True)
    from pathprof.analysis.merge_output import write_merged
    return write_merged(hosts, first, n, stages, offsets, link_docs, pd.concat(wires, ignore_index=True), to_first,
                        out, runs_root)


def parse_shift(items: list[str]) -> dict:
    """--shift HOST=US (repeatable) -> {host: ns}."""
    out = {}
    for it in items or []:
        host, sep, us = it.partition("=")
        try:
            val = float(us)
            if not sep or not host or not math.isfinite(val):
                raise ValueError
        except ValueError:
            raise UserError(f"--shift {it!r}: expected HOST=MICROSECONDS, e.g. pp-h21-srv=25000") from None
        out[host] = int(round(val * 1e3))
    return out


def parse_drift(items: list[str]) -> dict:
    """--drift HOST=PPM (repeatable) -> {host: ppm}."""
    out = {}
    for it in items or []:
        host, sep, ppm = it.partition("=")
        try:
            val = float(ppm)
            if not sep or not host or not math.isfinite(val) or abs(val) >= 1e5:
                raise ValueError
        except ValueError:
            raise UserError(f"--drift {it!r}: expected HOST=PPM (parts per million, |PPM| < 100000), e.g. "
                            "pp-h21-srv=50") from None
        out[host] = val
    return out
