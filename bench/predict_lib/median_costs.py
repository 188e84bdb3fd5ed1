#!/usr/bin/env python3
"""Offline, on a recorded `bench/predict all` (PP_BENCH_RUNS, default /tmp/pp-bench-predict): each base's one-client
prediction with the idle costs its run recorded (the last run's figure, before machine_costs kept the median) and
with the median of the last RECENT_RUNS runs before it that measured them (what machine_costs keeps now).

    bench/predict_lib/median_costs.py [ALL_DIR]
"""
import json
import os
import statistics
import sys
from pathlib import Path

from pathprof.agent.host.machine_costs import RECENT_RUNS
from pathprof.analysis import predict as P
from pathprof.analysis.predict_inputs import learned_costs
from pathprof.analysis.rundir import RunDir

root = Path(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("PP_BENCH_RUNS", "/tmp/pp-bench-predict") + "/all")
runs = sorted(p for p in root.iterdir() if p.is_dir() and p.name[:8].isdigit())
learned = {}
for r in runs:
    rd = RunDir.open(r)
    try:
        learned[r.name] = learned_costs(rd, rd.summary())
    except Exception:  # noqa: BLE001 - a run that cannot be read teaches nothing
        learned[r.name] = {}
plan = [line.split("|") for line in (root / "plan").read_text().splitlines() if line.startswith("clients-")]
for t, base, _, meas in plan:
    bname = Path(base).name
    one = [m.split("=")[1] for m in meas.split() if m.startswith("1=")][0]
    rd = RunDir.open(base)
    costs_file = root / f"learned-clients-{bname}.json"
    machine = json.loads(costs_file.read_text()) if costs_file.exists() else {}
    before = [n for n in learned if n < bname]
    med = dict(machine)
    for key in ("idle_wakeup_us", "lowload_runqueue_us"):
        vals = [learned[n][key] for n in before if key in learned[n]][-RECENT_RUNS:]
        if vals:
            med[key] = {"value": statistics.median(vals), "run": "median", "at": "x",
                        "samples": [{"value": v} for v in vals]}
    m1 = P.measured_tps(RunDir.open(one).summary())
    out = []
    for label, mach in (("as recorded", None), ("median", med)):
        if mach is None:
            b = P.base_of(rd, rd.summary(), machine=machine)
        else:
            costs = {**machine, **(rd.run.machine_costs or {})}
            costs.update({k: v for k, v in mach.items() if k in ("idle_wakeup_us", "lowload_runqueue_us")})
            b = P.base_from_run(rd.summary(), P.progress_tps(rd.path), rd.run.topology.spec or {}, costs)
        (row,) = P.predict(b, [1])
        out.append(f"{label} {row['tps']:8.0f} {100*(row['tps']/m1-1):+6.1f} %")
    print(f"{t:22s} {bname}  measured {m1:8.0f}  " + "  ".join(out), flush=True)
