"""`pathprof topology up|down`: build a path and leave it up for poking at by hand, then remove it."""
from __future__ import annotations

import sys
from pathlib import Path

from pathprof.agent.cli import args as cli_args
from pathprof.agent.host.journal import JOURNAL_DIR, Journal
from pathprof.agent.host.machine import require_root
from pathprof.agent.run.owned import STATE_ROOT
from pathprof.errors import UserError


def _run_id(name: str) -> str:
    return "topology-" + Path(name).stem


def up(a) -> int:
    from pathprof.topologies import builder, spec
    require_root()
    topo = spec.load(a.name, cli_args.topo_options(a), getattr(a, "link", None))
    journal = Journal(_run_id(topo.name))
    if journal.path.exists():
        raise UserError(f"topology {topo.name} is already up (pathprof topology down {a.name})")
    try:
        builder.build(topo, journal, STATE_ROOT / journal.run_id, progress=lambda s: print(f"creating {s}",
                                                                                             file=sys.stderr))
    except BaseException:
        journal.teardown()
        raise
    print(f"{topo.name} is up; namespaces: {', '.join(h.netns or '(root)' for h in topo.hosts.values())}. "
          f"Remove it with: pathprof topology down {a.name}")
    return 0


def down(a) -> int:
    require_root()
    from pathprof.topologies import spec
    name = spec.load(a.name).name if (a.name in spec.builtin_names() or a.name.endswith(".toml")) else a.name
    path = JOURNAL_DIR / f"{_run_id(name)}.jsonl"
    if not path.exists():
        raise UserError(f"topology {name} is not up (no journal {path})")
    problems = Journal.load(path).teardown()
    if problems:
        raise UserError("could not remove: " + "; ".join(problems))
    print(f"{name} removed")
    return 0
