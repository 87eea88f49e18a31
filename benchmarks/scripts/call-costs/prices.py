"""-k auto's priors on the default pair (llama.cpp, the Q4_K_M target and its Q4_0 draft,
2 threads), measured afresh three times (policy/calibrate.measure, no cost cache): a JSON
line each, in milliseconds. Run from the repository root with the code to measure:

    PYTHONPATH=src python benchmarks/scripts/call-costs/prices.py
"""
import json
import sys

from specsample.app.arguments import ModelOptions
from specsample.app.assemble import assemble
from specsample.policy import calibrate
from specsample.policy.calibrate import measure, probe_context

print("calibrate from", calibrate.__file__, file=sys.stderr)
models = assemble(ModelOptions(threads=2, ctx_size=4096), drafting=True)
target, draft = models.target, models.draft
context = probe_context(target)
target.rollback(0)
target.score(context, num_logits=1)
for _ in range(3):
    measured = measure(target, draft, context, 5)
    print(json.dumps({k: [round(1000 * x, 2) for x in v] if isinstance(v, list) else
                      round(1000 * v, 2) if isinstance(v, float) else v for k, v in measured.items()}))
