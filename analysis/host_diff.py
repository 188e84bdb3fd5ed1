"""Host differences (listed first by `pathprof diff`): a gap between machines is not a gap between paths. Moved
out of analysis.explain (which explains the gap itself)."""
from __future__ import annotations

from pathprof.analysis.run_model import Summary


def _dig(summary: dict, *paths: str):
    """First non-empty value among dotted key paths, so both the summary layout and the run.json layout work."""
    for path in paths:
        cur = summary
        for key in path.split("."):
            cur = cur.get(key) if isinstance(cur, dict) else None
            if cur is None:
                break
        if cur not in (None, ""):
            return cur
    return None


_HOST_FIELDS = [
    ("kernel", ("host.kernel", "kernel")),
    ("CPUs", ("host.cpus", "cpu_count", "cpus")),
    ("OS", ("host.os",)),
    ("machine", ("host.machine",)),
    ("pathprof version", ("pathprof_version", "versions.pathprof")),
    ("PostgreSQL version", ("postgres_version", "postgres.version", "versions.postgres")),
    ("pgbench version", ("pgbench_version", "pgbench.version", "versions.pgbench")),
    ("accelerator", ("accelerator", "host.accelerator")),
    ("probe level", ("probe_level", "probes.level", "probes")),
    ("hostname", ("host.hostname", "hostname")),
    # Workload differences are not host differences, but they invalidate a path comparison just the same.
    ("clients", ("clients", "workload.clients")),
    ("threads", ("threads", "workload.threads")),
    ("mode", ("workload.mode",)),
    ("script", ("workload.script",)),
    ("new connection per transaction", ("workload.connect",)),
]


def host_differences(a: dict | Summary, b: dict | Summary) -> list[str]:
    """Human lines such as "kernel: 6.1.0-18-amd64 → 6.18.0" for every machine/version/workload fact that differs.
    A fact missing on one side is reported ("unknown"), since it may hide a difference. Read by the dotted paths
    above (they name the document's own layout and older ones), over the document as it was written."""
    a, b = Summary.of(a).doc, Summary.of(b).doc
    out = []
    for label, paths in _HOST_FIELDS:
        va, vb = _dig(a, *paths), _dig(b, *paths)
        if va is None and vb is None:
            continue
        if str(va) != str(vb):
            out.append(f"{label}: {va if va is not None else 'unknown'} → {vb if vb is not None else 'unknown'}")
    return out + hook_differences(a.get("probe_hooks"), b.get("probe_hooks"))


def hook_differences(a: dict | None, b: dict | None) -> list[str]:
    """Warnings for events two runs measured through different hooks (run.json probes.hooks: a tracepoint on one
    kernel, fentry/fexit on another, a stage missing): the stage keeps its meaning, but its edge sits a few
    instructions elsewhere, so a small gap in it may be the hook's. A run recorded before hooks were chosen has
    none: nothing to compare."""
    if not a or not b:
        return []
    ways = lambda h: {e["event"]: e.get("hook") for e in h.get("events", [])}  # noqa: E731
    wa, wb = ways(a), ways(b)
    out = []
    for event in [*wa, *(e for e in wb if e not in wa)]:
        ha, hb = wa.get(event), wb.get(event)
        if ha != hb:
            out.append(f"WARNING measured through different hooks, {event}: {ha or 'none (stage missing)'} → "
                       f"{hb or 'none (stage missing)'}")
    if a.get("object") != b.get("object"):
        out.append(f"probe object: {a.get('object')} → {b.get('object')} (kernel fields read by kfunc vs probe-read: "
                   "the probes' own cost differs)")
    return out


