"""Exports: sampled transaction traces as Chrome trace-event JSON (opens in ui.perfetto.dev and chrome://tracing),
stage tables as CSV or Parquet.

Trace-event format: a JSON object {"traceEvents": [...], "displayTimeUnit": ..., "otherData": {...}}; complete
events are ph "X" with ts/dur in microseconds (fractions allowed) and integer pid/tid; names of processes and
threads come from ph "M" metadata events (process_name / thread_name with args.name).
"""
from __future__ import annotations

import json
import math
from numbers import Integral, Real
from pathlib import Path

import pandas as pd
from pathprof.analysis.client import client_of
from pathprof.errors import UserError

# Synthetic pids for spans recorded without one (kernel-side stages, device hops): far above pid_max's default so
# they never collide with a real process, one per role so each hop still gets its own track.
_SYNTHETIC_PID_BASE = 10_000_000
_PHASES = set("BEXiIbenMCsftPONDSTpRAvV(),=")
_METADATA_NAMES = {"process_name", "process_labels", "process_sort_index", "thread_name", "thread_sort_index"}


def _int_or(value, default: int) -> int:
    try:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return default
        return int(value)
    except (TypeError, ValueError):
        return default


def to_perfetto(traces: pd.DataFrame, meta: dict) -> dict:
    """Trace-event document: one process track per pid (named by role/hop), one thread track per tid, one "X"
    span per row. Columns `ts_ns, dur_ns, pid, tid, role, stage, txn`; only `ts_ns` is required (without it a span
    has no place): a missing pid becomes a per-role synthetic pid, tid defaults to pid, dur to 0, stage to "span".
    Timestamps are rebased to the first span so the numbers in the UI are small."""
    if traces is None or len(traces) == 0:
        events: list[dict] = []
        return {"traceEvents": events, "displayTimeUnit": "ns", "otherData": _other_data(meta, 0)}
    if "ts_ns" not in traces.columns:
        raise UserError("traces have no ts_ns column; this run directory's traces.parquet is not from pathprof "
                        "or is damaged; re-record with --trace-sample N")
    df = traces.copy()
    n = len(df)
    df = df[pd.to_numeric(df["ts_ns"], errors="coerce").notna()]
    dropped = n - len(df)
    for col, default in (("role", "unknown"), ("stage", "span"), ("txn", None)):
        if col not in df.columns:
            df[col] = default
    if "dur_ns" not in df.columns:
        df["dur_ns"] = 0
    roles = sorted({str(r) for r in df["role"].fillna("unknown")})
    synthetic = {r: _SYNTHETIC_PID_BASE + i for i, r in enumerate(roles)}
    if "pid" not in df.columns:
        df["pid"] = None
    if "tid" not in df.columns:
        df["tid"] = None

    t0 = int(pd.to_numeric(df["ts_ns"]).min())
    events = []
    tracks: dict[int, str] = {}
    threads: dict[tuple[int, int], str] = {}
    for row in df.itertuples(index=False):
        role = "unknown" if pd.isna(row.role) else str(row.role)
        pid = _int_or(row.pid, synthetic[role])
        tid = _int_or(row.tid, pid)
        tracks.setdefault(pid, role)
        threads.setdefault((pid, tid), role)
        dur_ns = max(_int_or(row.dur_ns, 0), 0)
        args = {"role": role}
        txn = _int_or(row.txn, -1)
        if txn >= 0:
            args["txn"] = txn
        events.append({"name": "span" if pd.isna(row.stage) else str(row.stage), "cat": role, "ph": "X",
                       "ts": (int(row.ts_ns) - t0) / 1000.0, "dur": dur_ns / 1000.0, "pid": pid, "tid": tid,
                       "args": args})
    # Metadata first: viewers name tracks from these; sort index keeps the path order pgbench → … → backend.
    order = {r: i for i, r in enumerate(_track_order(list(tracks.values()), client_of(meta)))}
    meta_events = []
    for pid, role in tracks.items():
        label = role if pid >= _SYNTHETIC_PID_BASE else f"{role} (pid {pid})"
        meta_events.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": label}})
        meta_events.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
                            "args": {"sort_index": order[role]}})
    for (pid, tid), role in threads.items():
        meta_events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                            "args": {"name": f"{role} {tid}" if tid != pid or pid < _SYNTHETIC_PID_BASE else role}})
    return {"traceEvents": meta_events + events, "displayTimeUnit": "ns", "otherData": _other_data(meta, dropped)}


def _track_order(roles: list[str], client: str = "pgbench") -> list[str]:
    """Client first (pgbench, or the program `attach` found), server last, hops in between, so the UI reads like
    the path."""
    rank = {client: 0, "backend": 90, "postmaster": 91}
    return sorted(dict.fromkeys(roles), key=lambda r: (rank.get(r, 50), r))


def _other_data(meta: dict, dropped: int) -> dict:
    """Run facts shown in Perfetto's trace info; strings only, as viewers expect flat metadata."""
    meta = meta or {}
    out = {}
    for key in ("run_id", "topology", "clients", "pathprof_version", "created", "run_dir"):
        val = meta.get(key)
        if isinstance(val, dict):
            val = val.get("name", json.dumps(val, sort_keys=True))
        if val is not None:
            out[key] = str(val)
    if dropped:
        out["dropped_rows_without_ts"] = str(dropped)
    return out


def validate_trace_events(doc) -> list[str]:
    """Problems that would make a trace-event viewer reject or misplace events; [] when the document is valid."""
    errors: list[str] = []
    if isinstance(doc, list):                      # the format's bare-array form is valid too
        events = doc
    elif isinstance(doc, dict):
        events = doc.get("traceEvents")
        if not isinstance(events, list):
            return ["traceEvents missing or not a list"]
        unit = doc.get("displayTimeUnit")
        if unit is not None and unit not in ("ms", "ns"):
            errors.append(f"displayTimeUnit must be 'ms' or 'ns', not {unit!r}")
    else:
        return [f"document must be an object or an array, not {type(doc).__name__}"]
    try:
        json.dumps(doc, allow_nan=False)
    except (TypeError, ValueError) as exc:
        errors.append(f"not strict JSON: {exc}")

    for i, ev in enumerate(events):
        errors += _event_errors(f"event {i}", ev)
    return errors


def _is_int(v) -> bool:
    return isinstance(v, Integral) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, Real) and not isinstance(v, bool) and math.isfinite(v)


def _event_errors(where: str, ev) -> list[str]:
    """validate_trace_events' checks of one event."""
    errors: list[str] = []
    if not isinstance(ev, dict):
        return [f"{where}: not an object"]
    ph = ev.get("ph")
    if not isinstance(ph, str) or ph not in _PHASES:
        return [f"{where}: ph {ph!r} is not a trace-event phase"]
    if not isinstance(ev.get("name"), str) and ph in "XBiIM":
        errors.append(f"{where}: name missing or not a string")
    for key in ("pid", "tid"):
        if key in ev and not _is_int(ev[key]):
            errors.append(f"{where}: {key} must be an integer")
    if "pid" not in ev:
        errors.append(f"{where}: pid missing")
    if "args" in ev and not isinstance(ev["args"], dict):
        errors.append(f"{where}: args must be an object")
    if ph == "M":
        if ev.get("name") not in _METADATA_NAMES:
            errors.append(f"{where}: unknown metadata name {ev.get('name')!r}")
        elif ev["name"].endswith("_name") or ev["name"] == "process_labels":
            key = "labels" if ev["name"] == "process_labels" else "name"
            if not isinstance((ev.get("args") or {}).get(key), str):
                errors.append(f"{where}: {ev['name']} needs args.{key} as a string")
        elif not _is_int((ev.get("args") or {}).get("sort_index")):
            errors.append(f"{where}: {ev['name']} needs an integer args.sort_index")
        return errors
    if not _is_num(ev.get("ts")):
        errors.append(f"{where}: ts missing or not a finite number (µs)")
    elif ev["ts"] < 0:
        errors.append(f"{where}: ts is negative")
    if "tid" not in ev:
        errors.append(f"{where}: tid missing")
    if ph == "X":
        if not _is_num(ev.get("dur")):
            errors.append(f"{where}: complete event needs a finite numeric dur (µs)")
        elif ev["dur"] < 0:
            errors.append(f"{where}: dur is negative")
    return errors


def _stage_frame(stages) -> pd.DataFrame:
    """A summary (its `stages` list), a list of stage dicts, or a DataFrame (stages.parquet) as a DataFrame."""
    if isinstance(stages, pd.DataFrame):
        return stages
    if isinstance(stages, dict):
        stages = stages.get("stages") or []
    return pd.DataFrame(list(stages))


def stages_to_csv(stages, path: Path) -> Path:
    """CSV of a stage table. Histogram columns (arrays per row) become JSON lists so the file stays one row per
    stage and re-readable by anything."""
    df = _stage_frame(stages).copy()
    for col in df.columns:
        if df[col].map(lambda v: hasattr(v, "__len__") and not isinstance(v, (str, bytes))).any():
            df[col] = df[col].map(lambda v: json.dumps(list(v), default=float)
                                  if hasattr(v, "__len__") and not isinstance(v, (str, bytes)) else v)
    path = Path(path)
    df.to_csv(path, index=False)
    return path


def stages_to_parquet(stages, path: Path) -> Path:
    path = Path(path)
    _stage_frame(stages).to_parquet(path, index=False)
    return path


def write_perfetto(traces: pd.DataFrame, meta: dict, path: Path) -> Path:
    """to_perfetto, validated, written as strict JSON; a validation failure is our bug, so it raises."""
    doc = to_perfetto(traces, meta)
    problems = validate_trace_events(doc)
    if problems:
        raise AssertionError("perfetto export is invalid: " + "; ".join(problems[:5]))
    path = Path(path)
    path.write_text(json.dumps(doc, allow_nan=False, separators=(",", ":")))
    return path
