"""The client's name in stage, component and span names (#35.4): `client.sysbench`, `runqueue.python3`,
`sysbench.user`, where pathprof attached to a client that is not pgbench.

The probes give every client process one role, `pgbench` (PROBE_ROLE), whatever program it runs: the raw tables
(stages.parquet, cpu.parquet) keep that role, and the names a user reads are made with the client's name recorded
in run.json (`workload.client`: the comm of the client processes `pathprof attach` found). A run pathprof drove
with pgbench, and every run directory recorded before the name was, has none: its client is `pgbench`."""
from __future__ import annotations

import re

PROBE_ROLE = "pgbench"          # the probes' role of the client's processes (agent.probing: session.track)
DEFAULT = "pgbench"             # the client pathprof drives itself, and every older run's
# names that stage and component names already give other processes: a client called so is told apart
_TAKEN = {"backend", "postmaster", "pg_aux", "kernel", "other", "probes", "idle", "softirq", "netfilter", "execute"}
_MAX = 32


def name_of(comms: list[str]) -> str:
    """The client's name from its processes' comms: one program's name, or several joined with '+' (psql+python3).
    A dot would split a stage name (`client.python3.11`), so dots and blanks become '-'; a name another part of
    the path already has becomes `client-<name>`."""
    clean = sorted({re.sub(r"[.\s/]+", "-", c.strip()).strip("-") for c in comms if c and c.strip()})
    clean = [c for c in clean if c]
    if not clean:
        return DEFAULT
    name = "+".join(clean)[:_MAX]
    return f"client-{name}" if name in _TAKEN else name


def client_of(doc) -> str:
    """The client's name of a run.json (RunMeta) or a report document (Summary), or of a dict of either."""
    from pathprof.analysis.run_model import RunMeta, Summary
    if isinstance(doc, dict):
        doc = Summary.of(doc)
    if isinstance(doc, (RunMeta, Summary)):
        return doc.workload.client or DEFAULT
    return DEFAULT


def label(role: str, client: str) -> str:
    """A role as stage names show it: the client's role by the client's name, every other role as it is."""
    return client if role == PROBE_ROLE else role
