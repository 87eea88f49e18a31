"""The default configuration on the replay's four cells at seeds 0-2 (noise 0.1): each
cell's modelled seconds, decode seconds and tokens per target call, as JSON. Run on two
trees and compare, to show that a step keeps (or what it changes of) the replayed
results:

    PYTHONPATH=src:. python benchmarks/scripts/planner-sensitivity/defaults.py after.json
    (the same on the other tree) before.json; cmp before.json after.json
"""

import json
import sys

from benchmarks.sensitivity import CELLS, play
from specsample.policy.config import PLANNER

out = {cell: [play(cell, PLANNER, 0.1, 0.0, seed) for seed in range(3)] for cell in CELLS}
with open(sys.argv[1], "w") as f:
    json.dump(out, f, indent=1)
for cell, runs in out.items():
    print(cell, [(round(r["seconds"], 3), round(r["decode_seconds"], 3), round(r["tokens_per_call"], 3)) for r in runs])
