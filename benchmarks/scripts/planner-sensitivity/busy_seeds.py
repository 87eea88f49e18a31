"""bf16-single under a busy neighbour (--busy 0.01, noise 0.1) with several seeds per
variant, paired by seed: each variant's decode seconds over the default's at the same
seed, their mean, standard error, least and most. The study's one seed a variant could
not decide this cell (its default spreads 4.8% over seeds). It varies PlannerConfig
fields by name, so the numbers that are constants now need the tree of edb9147 (before
issue 52's step made them constants):

    git archive edb9147 src benchmarks | tar -x -C /tmp/base && cd /tmp/base
    PYTHONPATH=src:. python /path/to/busy_seeds.py \\
        acceptance_decay,idle_decay,prior_strength,band_quorum,work_weight,goodput_decay,read_chunk 8
"""

import statistics
import sys

from benchmarks.sensitivity import play, variant
from specsample.policy.config import PLANNER

names, seeds = sys.argv[1].split(","), int(sys.argv[2])
base = [play("bf16-single", PLANNER, 0.1, 0.01, s)["decode_seconds"] for s in range(seeds)]
print("default decode seconds by seed:", [round(b, 1) for b in base])
for name in names:
    for label, factor in (("half", 0.5), ("double", 2.0)):
        config = variant(name, factor)
        ratios = [play("bf16-single", config, 0.1, 0.01, s)["decode_seconds"] / b for s, b in enumerate(base)]
        print(f"{name} {label} ({getattr(config, name)!r}): mean {statistics.mean(ratios):.3f} "
              f"+- {statistics.stdev(ratios) / len(ratios) ** 0.5:.3f} (min {min(ratios):.3f}, max {max(ratios):.3f})",
              flush=True)
