"""A served -k auto trace's rounds grouped by what they drafted from, whether their
call also read a prompt, and how many sequences they held: rounds, seconds, tokens
and tokens a second, and the target's and draft's seconds (the draft's reading of
unread text apart). Usage: python rounds.py TRACE.jsonl[.gz]"""

import collections
import gzip
import json
import sys

path = sys.argv[1]
with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
    lines = [json.loads(line) for line in f]
groups = collections.defaultdict(lambda: [0, 0.0, 0, 0.0, 0.0, 0.0])
for line in lines:
    prompt = line.get("load", 0) > 0 or line["target"].get("prompt", False)
    g = groups[(line["kind"], "yes" if prompt else "no", len(line["seqs"]))]
    g[0] += 1
    g[1] += line["seconds"]
    g[2] += sum(s.get("emitted", 0) for s in line["seqs"])
    g[3] += line["target"]["seconds"]
    g[4] += line["draft"]["seconds"]
    g[5] += line["draft"].get("reading", 0.0)
print("| drafted from | beside a prompt | sequences | rounds | seconds | tokens | tokens/s | target s | draft s | of it reading s |")
print("|---|---|---|---|---|---|---|---|---|---|")
for (kind, prompt, n), g in sorted(groups.items(), key=lambda item: (item[0][0], item[0][1], item[0][2])):
    print(f"| {kind} | {prompt} | {n} | {g[0]} | {g[1]:.1f} | {g[2]} | {g[2] / max(g[1], 1e-9):.2f} | {g[3]:.1f} | "
          f"{g[4]:.1f} | {g[5]:.1f} |")
reading = sum(line["draft"].get("reading", 0.0) for line in lines)
beside = sum(line["draft"].get("reading", 0.0) for line in lines if line.get("load", 0) > 0)
print(f"\n{len(lines)} rounds, {sum(line['seconds'] for line in lines):.1f} s; draft calls "
      f"{sum(line['draft']['seconds'] for line in lines):.2f} s, reading {reading:.2f} s ({beside:.2f} s beside a prompt)")
