"""bench/predict table: for each 16-client base of `all`, a machine-costs file taught the interleave exponent
(analysis.interleave, from the 4-client pairs) and the lone client's path factor (analysis.lone_client, from the
1-client pairs) by the client-count pairs of the *other* rounds only, as `pathprof sweep` teaches them
(agent.host.machine_costs.learn_from_pair): leave-one-round-out, so no prediction is made with a pair of its own
round. Prints each pair's exponent, and writes OUT/learned-clients-<base>.json.

    bench/predict_lib/teach_clients.py PLAN OUT BASE_COSTS"""
import json
import sys
import tempfile
from pathlib import Path

from pathprof.agent.host import machine_costs as mc
from pathprof.analysis import interleave, lone_client
from pathprof.analysis.hop_removal import remembered
from pathprof.analysis.rundir import RunDir

plan, out, base_costs = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
seen: dict[str, int] = {}
lines = []                                 # (round, base, [targets]) of each clients-* line
for line in plan.read_text().splitlines():
    t, base, _sc, meas = (line.split("|") + ["", "", "", ""])[:4]
    if not t.startswith("clients-"):
        continue
    rnd = seen[t] = seen.get(t, -1) + 1    # the n-th line of one target is round n
    lines.append((rnd, base, [m.split("=", 1)[1] for m in meas.split()]))
pairs = []                                 # (round, key, value, shape, "base -> target")
with tempfile.TemporaryDirectory() as tmp:
    for rnd, base, targets in lines:
        rb = RunDir.open(Path(base))
        for t in targets:
            scratch = Path(tmp) / "one.json"
            scratch.write_text("{}")
            rt = RunDir.open(Path(t))
            e = mc.learn_from_pair(rb, rb.summary(), rt, rt.summary(), path=scratch)
            print(f"{Path(base).name} -> {Path(t).name}: {'-' if e is None else f'{e:.3f}'}", file=sys.stderr)
            if e is not None:
                for key, entry in mc.current(scratch).items():
                    (sample,) = entry["samples"]
                    pairs.append((rnd, key, e, sample["hop"], sample["run"]))
try:
    costs = json.loads(base_costs.read_text())
except (OSError, ValueError):
    costs = {}
for rnd, base, _ in lines:
    doc = dict(costs)
    for key in (interleave.KEY, lone_client.KEY):
        entry = None
        for r2, k, e, shape, run in pairs:
            if r2 != rnd and k == key:
                entry = remembered(entry, e, run, "bench", shape)
        if entry:
            doc[key] = entry
    (out / f"learned-clients-{Path(base).name}.json").write_text(json.dumps(doc, indent=1) + "\n")
