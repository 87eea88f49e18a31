#!/bin/bash
# -k auto in serve, traced: where does a plain round's time go?
# Run from anywhere; writes serve.log and trace.jsonl under $OUT (default /tmp/serve-trace), prints
# each request's TTFT and total, then `specsample trace` of the run.
mkdir -p "${OUT:-/tmp/serve-trace}"
cd "$(dirname "$0")/../../.."
PY=.venv/bin/python
$PY -m specsample serve --threads 2 --ctx-size 2048 --parallel 2 --no-cache-prompt --port 8131 --trace ${OUT:-/tmp/serve-trace}/trace.jsonl > ${OUT:-/tmp/serve-trace}/serve.log 2>&1 &
pid=$!
for i in $(seq 1 120); do curl -sf http://127.0.0.1:8131/health >/dev/null && break; sleep 1; done
$PY - <<'PY'
import time, httpx, json
from specsample.bench.tasks import humaneval_problems
probs = humaneval_problems()[:4]
model = httpx.get("http://127.0.0.1:8131/v1/models").json()["data"][0]["id"]
for p in probs:
    t0 = time.time(); first = None; n = 0
    with httpx.stream("POST", "http://127.0.0.1:8131/v1/completions", json={"model": model, "prompt": p["prompt"] if isinstance(p, dict) else p.prompt, "max_tokens": 64, "temperature": 0, "stream": True}, timeout=600) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                d = json.loads(line[6:])
                if d["choices"] and d["choices"][0].get("text"):
                    first = first or time.time(); n += 1
    t1 = time.time()
    print(f"ttft {first - t0:.2f} s, total {t1 - t0:.2f} s, chunks {n}")
PY
kill $pid; wait $pid 2>/dev/null
$PY -m specsample trace ${OUT:-/tmp/serve-trace}/trace.jsonl
