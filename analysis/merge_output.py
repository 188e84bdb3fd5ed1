"""The merged run directory (pathprof.analysis.merge): run.json, stages.parquet, wire.parquet, traces.parquet and
topology.json, in the shape every other command reads."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd
from pathprof.analysis.rundir import SCHEMA, RunDir
from pathprof.errors import UserError

MERGED_SCHEMA = SCHEMA     # >= 1.1: + scope, hosts, clock_offsets, links (additive; analysis.rundir)


def _create(out: Path | None, runs_root: Path) -> RunDir:
    if out is None:
        return RunDir.create(runs_root, "merged")
    out = Path(out)
    if out.exists():
        if not out.is_dir() or any(out.iterdir()):
            raise UserError(f"-o {out}: already exists and is not an empty directory")
        out.rmdir()
    out.parent.mkdir(parents=True, exist_ok=True)
    return RunDir.create(out.parent, "merged", run_id=out.name)


def _legs_mean_us(stages: pd.DataFrame, n: int) -> float | None:
    from pathprof.analysis import stages as views
    lv = views.latency_view(stages, n, 0.0)
    legs = [s["us_per_txn"] for s in lv["stages"] if s["leg"] in ("request", "server", "response")
            and "parent" not in s]
    return sum(legs) if legs else None


def _traces(hosts, to_first: dict) -> pd.DataFrame | None:
    frames = []
    for h in hosts:
        tr = h.rd.read_frame("traces.parquet")
        if tr is not None and len(tr):                     # onto the first host's clock (drift included)
            ts = to_first[h.name](h.shifted(tr["ts_ns"]))
            frames.append(tr.assign(ts_ns=np.round(ts).astype("int64"), host=h.name))
    return pd.concat(frames, ignore_index=True).sort_values("ts_ns", kind="stable") if frames else None


def _clock_offset_us(h, to_first) -> float:
    """The host's clock minus the first's, at its first marker (0 for the first host)."""
    t = float(h.messages["ts_ns"].min()) if len(h.messages) else 0.0
    return round((t - float(to_first[h.name](np.array([t]))[0])) / 1e3, 3)


OUTSIDE_NOTE_PCT = 5.0      # a host recording this much beyond the common interval is said in the notes


def outside_common(hosts, to_first) -> dict[str, float]:
    """Each host's share (%) of its sampled messages outside the interval every host recorded (the latest first
    marker to the earliest last one, on the first host's clock)."""
    spans = {}
    for h in hosts:
        ts = to_first[h.name](h.messages["ts_ns"].to_numpy()) if len(h.messages) else np.array([])
        spans[h.name] = ts
    if any(not len(ts) for ts in spans.values()):
        return {}
    lo, hi = max(ts.min() for ts in spans.values()), min(ts.max() for ts in spans.values())
    return {name: round(float(np.mean((ts < lo) | (ts > hi))) * 100.0, 1) for name, ts in spans.items()}


def _outside_note(outside: dict[str, float]) -> str | None:
    over = {k: v for k, v in outside.items() if v > OUTSIDE_NOTE_PCT}
    if not over:
        return None
    return ("intervals: " + ", ".join(f"{k} recorded {v:.0f} % of its sampled messages outside the interval every "
                                      "host recorded" for k, v in over.items())
            + ": its per-transaction figures include a period the other hosts did not measure (where hosts share "
            "a loaded machine, the path does not behave the same with and without the other agents' probes), "
            "which shifts the closure. Record every host over the same interval: start the server side's agents "
            "first with a --duration covering the others' (attach also joins connections opened after its start)")


def _topology(hosts) -> dict:
    chain, doc_hosts, unseen = [], {}, []
    for h in hosts:
        topo = h.rd.read_json("topology.json") or {}
        chain += [{**e, "host": h.name} for e in topo.get("chain") or []]
        doc_hosts[h.name] = {"netns": (h.rd.meta.get("scope") or {}).get("netns"), "addresses": []}
        unseen += [f"{h.name}: {u}" for u in topo.get("unseen") or [] if "another machine" not in u
                   and "outside this machine" not in u]
    return {"topology": "merged", "source": "pathprof merge", "chain": chain, "hosts": doc_hosts,
            "client_connections": hosts[0].connections, "unseen": unseen, "sockets": {}}


def _offset_text(o: dict) -> str:
    text = f"{o['host_a']} -> {o['host_b']} {o['offset_us']:+.3f} ± {o['bound_us']:.3f} µs"
    if o.get("drift_applied"):
        a, b = o["offset_span_us"]
        text += f", drifting {o['drift_ppm']:+.2f} ppm ({a:+.3f} -> {b:+.3f} µs over the run)"
    return text


def _probes_doc(hosts, n: int, notes: list) -> dict:
    from pathprof.analysis.merge_cpu import merged_probe_cost
    doc = {"level": (hosts[0].rd.meta.get("probes") or {}).get("level", "basic"), "notes": notes, "lost": {},
           "schedule": {"window_s": 0.0, "period_s": 0.0, "duty_pct": 100.0, "always_on": True}}
    cost = merged_probe_cost(hosts, n)
    if cost:
        doc["cost"] = cost
    return doc


def write_merged(hosts, first, n, stages, offsets, link_docs, wires, to_first, out, runs_root) -> RunDir:
    import pathprof
    rd = _create(out, runs_root)
    from pathprof.analysis.merge_cpu import merged_cpu
    cpu, cpu_doc, cpu_note = merged_cpu(hosts, n)
    mean_us = _legs_mean_us(stages, n)
    duration = (first.rd.meta.get("observed") or {}).get("duration_s")
    notes = [f"merged from {len(hosts)} hosts' runs: " + ", ".join(f"{h.name} ({h.rd.path})" for h in hosts),
             "per-transaction figures: each host's tables scaled to the first host's transactions (its agents did "
             "not start and stop at the same instant)",
             "wire.<receiver> between hosts: the sender's send start -> the receiver's socket ready, corrected by "
             "the hosts' clock offset (" + "; ".join(_offset_text(o) for o in offsets) + ")",
             cpu_note]
    outside = outside_common(hosts, to_first)
    notes += [x for x in (_outside_note(outside),) if x]
    notes += [f"{h.name}: {x}" for h in hosts for x in (h.rd.meta.get("probes") or {}).get("notes") or []
              if x.startswith("lost")]
    w = dict(first.rd.meta.get("workload") or {})
    rd.meta["schema"] = MERGED_SCHEMA
    rd.update(pathprof_version=pathprof.__version__, host=first.rd.meta.get("host") or {},
              topology={"name": "merged", "source": "pathprof merge", "options": {}, "spec": None},
              workload={**w, "clients": first.connections},
              postgres=next((h.rd.meta.get("postgres") for h in hosts if (h.rd.meta.get("postgres") or {}).get("pid")),
                            {"owned": False}),
              observed={"source": "merge", "tps": first.tps, "transactions": n, "failed": None,
                        "latency_ms": {"mean": round(mean_us / 1e3, 6) if mean_us else None}, "duration_s": duration},
              hosts=[{"name": h.name, "run_dir": str(h.rd.path), "run_id": h.rd.meta.get("run_id"),
                      "netns": (h.rd.meta.get("scope") or {}).get("netns"),
                      "hostname": (h.rd.meta.get("scope") or {}).get("hostname"), "transactions": h.txns,
                      "tps": h.tps, "shift_us": h.shift_ns / 1e3 if h.shift_ns else None,
                      "drift_ppm": h.drift_ppm or None,
                      "clock_offset_us": _clock_offset_us(h, to_first),
                      "outside_common_pct": outside.get(h.name)} for h in hosts],
              clock_offsets=offsets, links=link_docs,
              cpu=cpu_doc or {}, probes=_probes_doc(hosts, n, notes),
              merged_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"), status="complete")
    rd.write_frame("stages.parquet", stages)
    rd.write_frame("wire.parquet", wires)
    if cpu is not None:
        rd.write_frame("cpu.parquet", cpu)
    tr = _traces(hosts, to_first)
    if tr is not None:
        rd.write_frame("traces.parquet", tr)
    rd.write_json("topology.json", _topology(hosts))
    return rd
