"""`pathprof merge`: the argparse entry and the command (pathprof.analysis.merge does the work)."""
from __future__ import annotations

import os
from pathlib import Path

DESCRIPTION = """\
Join the runs that several hosts' agents recorded of the same path, at the same time, into one run directory:
connections are matched by their 4-tuples across hosts (through NAT on either side, from conntrack's
translation each agent recorded), sampled messages by their TCP sequence numbers, and each pair of hosts'
clock offset is estimated from messages seen both ways (minimum-delay filtering, offset ± a bound that holds
by causality). The wire between two hosts becomes a stage per direction (wire.<receiver>, never negative);
every host's stages stay on their legs. The result is a normal run directory: report, compare, diff and export
read it."""

EPILOG = """\
examples (hosts as network namespaces of one machine; on real machines, drop --netns):
  pathprof attach --netns pp-srv --port 5432 --trace-sample 2 -T 10 &
  pathprof attach --netns pp-cli --remote 198.18.0.2:5432 --trace-sample 2 -T 10
  pathprof merge runs/...-attach runs/...-attach-2 -o runs/merged
  pathprof report runs/merged

Each input must come from `pathprof attach` (its run.json `scope` names the host and the connections leaving
it) with --trace-sample N, the same N on every host (the sampled messages are picked by their TCP sequence
numbers, identically everywhere). --shift HOST=US adds US µs to one host's recorded timestamps first: the
estimated offset must move by exactly that, a check of the estimator on hosts whose true offset is known.
--drift HOST=PPM makes one host's recorded clock run PPM parts per million fast from its first marker: where a
constant offset no longer fits the trips, merge applies the drift it estimates (clock_offsets drift_applied).
"""


def add_parser(sub, fmt) -> None:
    m = sub.add_parser("merge", help="join several hosts' runs of one path into one run", formatter_class=fmt,
                       description=DESCRIPTION, epilog=EPILOG)
    m.add_argument("runs", nargs="+", metavar="RUN_DIR", help="one run directory per host (at least two)")
    m.add_argument("-o", "--output", metavar="DIR", help="the merged run directory to create (default: a new "
                                                         "one under --runs-dir)")
    m.add_argument("--runs-dir", default=os.environ.get("PATHPROF_RUNS", "runs"), metavar="DIR",
                   help="where the merged run is created without -o (default: %(default)s, or $PATHPROF_RUNS)")
    m.add_argument("--shift", action="append", default=[], metavar="HOST=US",
                   help="add US microseconds to HOST's timestamps before merging (repeatable; a check of the "
                        "clock-offset estimate)")
    m.add_argument("--drift", action="append", default=[], metavar="HOST=PPM",
                   help="make HOST's recorded clock run PPM parts per million fast before merging (repeatable; a "
                        "check of the drift estimate)")
    m.add_argument("--json", action="store_true", help="print the merged run's JSON document on stdout")


def cmd_merge(a) -> int:
    from pathprof.agent.cli.main import _print_summary
    from pathprof.analysis.merge import merge, parse_drift, parse_shift
    rd = merge([Path(r) for r in a.runs], Path(a.output) if a.output else None, Path(a.runs_dir),
               parse_shift(a.shift), parse_drift(a.drift))
    return _print_summary(a, rd)
