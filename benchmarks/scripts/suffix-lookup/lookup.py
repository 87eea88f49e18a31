"""How long the suffix index (decoding/suffix.py) takes to index 1M tokens and to answer
a lookup on them. Zipf-distributed tokens over a 150k vocabulary, in 500 documents of
2,000 tokens, each repeating a quarter of an earlier one (served text repeats); half
the lookups end in text of an indexed document, half in fresh text.

    PYTHONPATH=src python benchmarks/scripts/suffix-lookup/lookup.py
"""

import time

import numpy as np

from specsample.decoding.suffix import SuffixIndex, propose

rng = np.random.default_rng(0)
docs = []
for i in range(500):
    d = (rng.zipf(1.2, 2000) % 150000).tolist()
    if docs:
        d[:500] = docs[rng.integers(len(docs))][1000:1500]
    docs.append(d)
t = time.perf_counter()
index = SuffixIndex(1 << 20)
for d in docs:
    index.add(d)
build = time.perf_counter() - t
corpus = index.corpus(None)
print(f"indexed {len(corpus)} tokens in {build:.2f} s")
times = []
for trial in range(2000):
    d = docs[rng.integers(len(docs))]
    j = int(rng.integers(64, 2000))
    context = d[:j] if trial % 2 else (rng.zipf(1.2, 64) % 150000).tolist()
    t = time.perf_counter()
    propose([corpus], context, 8)
    times.append(time.perf_counter() - t)
us = np.array(times) * 1e6
print(f"lookup: median {np.median(us):.0f} us, p90 {np.percentile(us, 90):.0f} us, max {us.max():.0f} us")
