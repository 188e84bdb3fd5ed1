"""A run's set-up steps that are not its main line: claiming its id, the probe gate and loading, the background
imports, and what to do with a template copy when a run ends early."""
from __future__ import annotations

import os
import time
from pathlib import Path

from pathprof.agent.host import proc
from pathprof.agent.host.journal import Journal
from pathprof.agent.run.options import RunOptions
from pathprof.errors import RequirementError, UserError
from pathprof.topologies import impairments as netem

STATE_ROOT = Path(os.environ.get("PATHPROF_STATE", "/var/lib/pathprof")) / "state"


def claim_run_id(runs_dir: Path, name: str) -> str:
    """A run id free everywhere a run's things are named by it (its run directory, journal and state directory):
    two runs started in the same second from different runs directories must not share a journal or a cluster,
    or one's teardown removes the other's. Claimed by creating the journal exclusively, with its owner line."""
    import json

    from pathprof.agent.host.journal import JOURNAL_DIR
    base = time.strftime("%Y%m%d-%H%M%S") + "-" + name.replace("/", "_")
    JOURNAL_DIR.mkdir(parents=True, exist_ok=True)
    for n in range(1, 100):
        rid = base if n == 1 else f"{base}-{n}"
        if (Path(runs_dir) / rid).exists() or (STATE_ROOT / rid).exists():
            continue
        try:
            with open(JOURNAL_DIR / f"{rid}.jsonl", "x") as f:
                f.write(json.dumps({"kind": "owner", "pid": os.getpid(), "start_time": proc.pid_start_time(
                    os.getpid())}) + "\n")
            return rid
        except FileExistsError:
            continue
    raise UserError(f"no free run id for {base} (99 runs of it this second?)")


def import_analysis() -> None:
    import pandas  # noqa: F401
    import pyarrow.parquet  # noqa: F401


def require_probes(opts: RunOptions) -> list[dict]:
    """Refuse before anything is built when this machine cannot run the asked-for probes; else the doctor's
    capabilities (run.json probes.capabilities)."""
    if opts.probes == "off":
        return []
    try:
        from pathprof.agent.probing import doctor
    except ImportError:
        raise RequirementError("the probes are not built into this pathprof; use --probes off") from None
    return doctor.require(opts.probes)


def load_probes(opts: RunOptions, topo, loaded: dict) -> None:
    """Import the probes (and pandas with them), create the session and load it: off the main thread. The
    session goes into `loaded` before it loads, so teardown can close whatever part of it was loaded."""
    loaded["session"] = probe_session(opts, topo)
    loaded["session"].start()


def probe_session(opts: RunOptions, topo):
    try:
        from pathprof.agent.probing import session as probes_mod
    except ImportError:
        raise RequirementError("the probes are not built into this pathprof; use --probes off") from None
    ports = sorted({topo.postgres.port, *[t.port for t in topo.client.targets.values() if t.port]} |
                   {int(s.options["port"]) for s in topo.services if "port" in s.options})
    cfg = probes_mod.ProbeConfig(level=opts.probes, netns=topo.namespaces(), service_ports=ports,
                                 postgres_bin=proc.which("postgres"), trace_sample=opts.trace_sample,
                                 window_s=opts.probe_window_s, period_s=opts.probe_period_s,
                                 hop_slots=len({s.name for s in topo.services}) + 1,
                                 tap_hop=any(s.kind == "qemu-guest" for s in topo.services),
                                 devices=bool(topo.links) or len(topo.namespaces()) > 1,
                                 lo_device=opts.probe_lo_device,
                                 qdisc=any(link.impairments() for link in topo.links), holds=netem.holds(topo),
                                 conn_split=bool(opts.workload.connect),
                                 hops=bool(topo.services),
                                 unix=any(t.unix for t in topo.client.targets.values()))
    return probes_mod.ProbeSession(cfg)


def settle(cluster) -> None:
    """Let a background template copy finish; its errors do not matter when the run is ending anyway."""
    if cluster is not None:
        try:
            cluster.wait()
        except Exception:
            pass


def abandon(cluster, journal: Journal) -> None:
    """A run refused before it began: nothing of it may stay."""
    settle(cluster)
    journal.teardown()
