"""`specsample bench ...` with every -k auto decision logged, one JSON line per plan, to
$TRACE (default /tmp/planner-trace.jsonl): what the drafter offered (sources, and the
draft's unread tokens, lag, and whether reading them stalls), the plan, the goodput
guard's bars and probe, the prices of a 1- and 5-token target call and a draft step
(t1, t5, d1, seconds), the share of draft calls hidden under a target call, the
model's first-position acceptance (acc0), and the answer so far. How the
overlap's chain of one-draft blocks was found (docs/results/rpc-overlap/trace-draft-rpc.jsonl, on f47f91b):

    taskset -c 1 .venv/bin/specsample rpc-worker --port 50073 --threads 1 &
    TRACE=trace.jsonl taskset -c 0 .venv/bin/python benchmarks/scripts/rpc-overlap/trace_planner.py bench \\
        --backend llamacpp --target-quant bf16 --tasks humaneval --prompts 2 --settings greedy --no-parity \\
        --no-plots --modes spec-auto --threads 1 --draft-rpc 127.0.0.1:50073 --out /tmp/trace-run

Today the same runs without --no-parity: parity is the research bench's (python -m
benchmarks.bench), and the installed `specsample bench` that this wraps has none.
"""
import json
import os
import sys

from specsample.policy import control

out = open(os.environ.get("TRACE", "/tmp/planner-trace.jsonl"), "w")
original = control.Planner.plan


def plan(self, offers, load=0):
    plans = original(self, offers, load)
    for seat, chosen in plans.items():
        offer, model = offers[seat], seat.acceptance.sources.get(control.MODEL)
        out.write(json.dumps({
            "available": {str(k): v for k, v in offer.available.items()}, "lag": offer.lag,
            "stalls": seat.stalls(offer) if control.MODEL in offer.available else None,
            "source": str(chosen.source), "m": chosen.length, "catch_up": chosen.catch_up,
            "barred": sorted(f"{size}:{kind}" for size, kind in self.goodput._barred), "probe": self.goodput.probe(1),
            "t1": self.prices.target(1), "t5": self.prices.target(5), "d1": self.prices.draft(1),
            "hidden": self.prices.draft.hidden, "acc0": model.at(0).value if model else None,
            "generated": seat.length.generated, "remaining": seat.length.expected_remaining(),
        }) + "\n")
    out.flush()
    return plans


control.Planner.plan = plan
from specsample.cli import main  # noqa: E402

sys.exit(main(sys.argv[1:]))
