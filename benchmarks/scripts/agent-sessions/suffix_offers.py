"""What the planner did with the suffix index's offers, from a `--trace` file of a
server run with --suffix-tokens: in the rounds the index offered a draft, what was
chosen (a suffix draft, a context lookup, a plain step, and why), how long the offers
and the chosen drafts were, how many suffix drafts were accepted, and the target's
price of a call of n tokens over a call of one (the trace's last prices).

    PYTHONPATH=src python benchmarks/scripts/agent-sessions/suffix_offers.py TRACE.jsonl
"""

import json
import sys
from collections import Counter


def kind(name: str | None) -> str:
    return "plain" if name in (None, "plain") else "suffix" if name.startswith("suffix") else \
        "lookup" if name.startswith("ngram") else name


lines = [json.loads(text) for text in open(sys.argv[1]) if text.strip()]
chosen, why, offered, lengths, suffix_drafts, prices = Counter(), Counter(), Counter(), Counter(), [0, 0], None
for line in lines:
    prices = line.get("prices") or prices
    for seq in line.get("seqs", []):
        offer = seq.get("offer") or {}
        sources = [s for s in offer if s.startswith("suffix")]
        if not sources:
            continue
        got = kind((seq.get("chosen") or [None])[0])
        chosen[got] += 1
        offered.update(offer[s] for s in sources)
        if got == "plain":
            why[seq.get("why")] += 1
        if got == "suffix":
            lengths[seq["chosen"][1]] += 1
            suffix_drafts[0] += seq.get("accepted", 0)
            suffix_drafts[1] += seq.get("drafted", 0)
rounds = sum(1 for line in lines for _ in line.get("seqs", []))
print(f"{rounds} sequence rounds; the suffix index offered a draft in {sum(chosen.values())}")
print("chosen where it offered:", dict(chosen.most_common()), "; plain because:", dict(why.most_common()))
print("offered lengths:", dict(sorted(offered.items())), "; chosen suffix draft lengths:", dict(sorted(lengths.items())))
print(f"suffix drafts accepted: {suffix_drafts[0]} of {suffix_drafts[1]}")
one = prices["target"]["1"]
print("target price of n tokens over 1:", {n: round(s / one, 2) for n, s in prices["target"].items()})
