"""What one draft step (a 1-token call of the default 0.5B draft) costs on an RPC worker
against in this process, for each --draft-quant: llama.cpp repacks weights for its
faster kernels locally but not on a worker. Run with a worker on 127.0.0.1:50073:

    taskset -c 1 .venv/bin/specsample rpc-worker --port 50073 --threads 1 &
    taskset -c 0 .venv/bin/python benchmarks/scripts/rpc-overlap/draft_step.py q4_0,q8_0,none
"""
import statistics
import sys
import time

from specsample.backends import load_backend
from specsample.backends.models import DEFAULT_DRAFT
from specsample.backends.rpc import parse_workers

for quant in sys.argv[1].split(","):
    for where in ("worker", "here"):
        workers = parse_workers("127.0.0.1:50073") if where == "worker" else None
        model = load_backend(DEFAULT_DRAFT, "llamacpp", threads=1, quant=None if quant == "none" else quant,
                             workers=workers, n_ctx=512)
        model.score(model.tokenizer.encode("def fibonacci(n):\n    if n < 2:\n        return n\n"), 1)
        times = []
        for t in range(30):
            t0 = time.perf_counter()
            model.score([100 + t], 1)
            times.append(time.perf_counter() - t0)
        print(f"{quant} {where}: median of 25 steps {1e3 * statistics.median(times[5:]):.1f} ms", flush=True)
        del model
