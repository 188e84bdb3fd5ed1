"""`pathprof predict RUN`: what-if TPS from one recorded run (analysis.predict)."""
from __future__ import annotations

import json
import sys

from pathprof.errors import UserError

DESCRIPTION = """\
Predict TPS and mean latency (the per-connection cycle, clients / TPS) for other client counts, without a hop,
over a longer wire, with the commit's WAL flush removed or the WAL device unthrottled, from ONE recorded run,
before changing anything.

The model is a closed queueing network solved by exact mean-value analysis (MVA): N clients circulate through
  queues   the CPUs as a whole (one multi-server centre, Seidmann's approximation), each single-threaded hop
           process (pgbouncer, docker-proxy: one server whose demand is its CPU per transaction), pgbench's
           threads (the client), the WAL flush and a row lock every transaction takes (deep runs)
  delays   link delay lines and rate limits, lock waits as measured, and wakeups onto idle CPUs (a delay that
           fades as the CPUs fill)
Its demands are the run's own CPU view and latency view, without the probes' cost, and two costs of the machine
that runs before it measured (/var/lib/pathprof/machine-costs.json, recorded in each run): the delay a wakeup onto
an idle CPU adds (for a run that never idled) and the CPU per packet of pathprof's own link delay line (for
--link, which `run --link` builds as that delay line, not as a longer wire); it is anchored so that it
reproduces the TPS the run measured outside its probe windows at its own client count (a hop whose thread was
busy all the time is priced at the time it holds its thread, not only its CPU). Other processes' load is left
out: the path is predicted with the host's CPUs to itself. Each prediction names what limits it (the CPUs, a
hop's process, the client, the WAL flush, or latency) and prints its assumptions; a TPS marked * leaves out the
delay of waking onto idle CPUs (the run never showed one), so it is too high where the CPUs idle between messages.

The band (tps_low..tps_high) is what this machine's own checked predictions of the same question (fewer
clients, more clients, without a hop) on the same shape of path missed by: every `compare` and `sweep` predicts
its runs from the first and measures them, and from 3 such checks the band covers 9 in 10 misses like theirs.
Until then it is +/- the root sum of squares of three figures of the run itself: the coefficient of variation of
pgbench's per-second TPS, the worse of its two closure errors, and the gap between its TPS with the probes
attached and without. A run that is noisy, or whose views do not add up, gets a wide band.
"""

EPILOG = """\
examples:
  pathprof predict runs/20261124-192331-loopback --clients 1,4,16,64
  pathprof predict runs/<pgbouncer run> --without pgbouncer
  pathprof predict runs/<docker-dnat run> --without docker-proxy --json
  pathprof predict runs/<nic run> --link wire:rtt_us=1000 --clients 1,16
  pathprof predict runs/<tpcb-like deep run> --pg-set synchronous_commit=off
  pathprof predict runs/<deep run, --wal-device 256 --wal-device-limit wiops=200> --wal-device-limit none

What the run cannot support is refused, not guessed: no CPU view (--probes off), a hop that was not probed, a
WAL setting on a run without --probes deep, a setting the model does not represent.
"""


def add_parser(sub, fmt) -> None:
    p = sub.add_parser("predict", help="predict TPS for other clients, without a hop, a longer wire (from one run)",
                       formatter_class=fmt, description=DESCRIPTION, epilog=EPILOG)
    p.add_argument("run", metavar="RUN_DIR")
    p.add_argument("--clients", metavar="N,N,...",
                   help="client counts to predict (default: 1,4,16,64 and the run's own)")
    p.add_argument("--without", action="append", default=[], metavar="HOP",
                   help="drop a hop: its stages, its CPU and the kernel work of its second connection (repeatable)")
    p.add_argument("--link", action="append", default=[], metavar="NAME:delay_us=N|rtt_us=N",
                   help="add delay to a link of the run's topology: a link name delays both directions (delay_us "
                        "each way, or rtt_us the round trip), an interface its egress only")
    p.add_argument("--pg-set", action="append", default=[], metavar="KEY=VALUE",
                   help="a server setting whose effect the model represents: synchronous_commit=off or fsync=off "
                        "(takes backend.wal_flush out of the commit; needs a --probes deep run)")
    p.add_argument("--wal-device-limit", metavar="none",
                   help="'none': the run's throttled WAL device without its throttle (the commit's WAL flush "
                        "becomes the device's own time in the disk view; needs a --probes deep run made with "
                        "--wal-device MB --wal-device-limit ...)")
    p.add_argument("--foreign-cpus", type=float, default=0.0, metavar="N",
                   help="predict on a shared machine: other processes take N CPUs (default: 0, the host's CPUs "
                        "to the path; the run's own foreign load is used to anchor the model, then left out)")
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")


def cmd_predict(a) -> int:
    from pathprof.agent.cli.multi import parse_clients
    from pathprof.analysis import predict as model
    from pathprof.analysis.rundir import RunDir
    rd = RunDir.open(a.run)
    summary = rd.summary()
    from pathprof.agent.host.machine_costs import current
    # the machine's costs the run recorded at its start; a run made before pathprof kept them: today's
    base = model.base_of(rd, summary, machine=current())
    clients = parse_clients(a.clients) if a.clients else sorted({1, 4, 16, 64, base.clients})
    links = dict(model.parse_link(t, base) for t in a.link)
    sc = model.Scenario(without=tuple(a.without), link_us=links, pg_set=model.parse_pg_set(a.pg_set, base, summary),
                        wal_unthrottled=model.parse_wal_limit(a.wal_device_limit, base))
    if not 0 <= a.foreign_cpus < base.ncpu:
        raise UserError(f"--foreign-cpus must be at least 0 and less than the host's {base.ncpu:g} CPUs")
    rows = model.predict(base, clients, foreign_cpus=a.foreign_cpus)
    if sc != model.Scenario():
        rows += model.predict(base, clients, sc, foreign_cpus=a.foreign_cpus)
    doc = {"run_dir": str(rd.path), "topology": summary.topology, "run_clients": base.clients,
           "measured_tps": base.measured_tps, "band_pct": base.band_pct, "band_parts": base.band_parts,
           "scenarios": rows}
    if a.json:
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        sys.stdout.write(render(doc))
    return 0


def render(doc: dict) -> str:
    lines = [f"pathprof predict — {doc['topology']}, recorded at {doc['run_clients']} clients, "
             f"{doc['measured_tps']:,.0f} TPS measured without probes",
             f"band ±{doc['band_pct']:.1f} % (TPS spread {doc['band_parts']['tps_spread_pct']} %, closure "
             f"{doc['band_parts']['closure_pct']} %, probes in/out {doc['band_parts']['probes_in_out_pct']} %)", ""]
    w = max(len(r["scenario"]) for r in doc["scenarios"])
    lines.append(f"{'scenario':<{w}}  {'clients':>7}  {'TPS':>9}  {'band':>19}  {'cycle ms':>8}  limited by")
    for r in doc["scenarios"]:
        band = f"{r['tps_low']:,.0f}..{r['tps_high']:,.0f}"
        tps = ("*" if r.get("idle_wakeups_unpriced") else "") + f"{r['tps']:,.0f}"
        lines.append(f"{r['scenario']:<{w}}  {r['clients']:>7}  {tps:>9}  {band:>19}  "
                     f"{r['latency_ms']:>8.3f}  {r['limited_by_text']}")
    checked = list(dict.fromkeys(r["band_from"] for r in doc["scenarios"] if r.get("question") and
                                 not r.get("band_from", "").startswith("the run's own")))
    lines += [f"band from {x}" for x in checked]
    if any(r.get("idle_wakeups_unpriced") for r in doc["scenarios"]):
        lines.append("*: " + next(r["note"] for r in doc["scenarios"] if r.get("idle_wakeups_unpriced")))
    seen = []
    for r in doc["scenarios"]:
        if r["scenario"] not in seen:
            seen.append(r["scenario"])
            lines += ["", f"assumptions ({r['scenario']}):"] + [f"  - {x}" for x in r["assumptions"]]
    if not doc["scenarios"]:
        raise UserError("nothing to predict")
    return "\n".join(lines) + "\n"
