"""bench/predict: teach a machine-costs file (PATHPROF_MACHINE_COSTS) the hop-removal ratio of recorded pairs, as
`pathprof compare` does (agent.host.machine_costs.learn_from_pair), for a leave-one-out table: a hop's removal is
predicted with the ratio learned from the *other* hop's pairs.

    PATHPROF_MACHINE_COSTS=FILE bench/predict_lib/learn_pair.py BASE_RUN TARGET_RUN [BASE TARGET ...]"""
import sys

from pathprof.agent.host import machine_costs as mc
from pathprof.analysis.rundir import RunDir

args = sys.argv[1:]
if not args or len(args) % 2:
    sys.exit(__doc__)
for a, b in zip(args[::2], args[1::2]):
    ra, rb = RunDir.open(a), RunDir.open(b)
    ratio = mc.learn_from_pair(ra, ra.summary(), rb, rb.summary())
    print(f"{a} -> {b}: {'not a hop removal of two saturated runs' if ratio is None else f'{ratio:.3f}'}")
