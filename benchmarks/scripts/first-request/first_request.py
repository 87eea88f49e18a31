"""A fresh server's first requests: start one server (`specsample serve` with the given
extra arguments, default pair, --parallel 1, 2 threads), wait for /health, then time
three short chat requests in turn (each 1 answer token, each a new prompt), and stop it.
Repeats the whole for --starts starts. Prints the time from launch to /health ready and
each request's time to first token.

    PYTHONPATH=src python benchmarks/scripts/first-request/first_request.py --starts 2 [-- serve args]

What it showed (2026-12-07, the 2-core AMD EPYC VM, flocked alone, the default Q4_K_M
pair, main at 148099a), two starts each:
- `-k auto`: ready after 35.7 and 21.6 s; requests 1.737 0.369 0.372 s and 1.345 0.436 0.376 s.
- `--autoregressive`: ready after 14.2 and 16.1 s; requests 0.901 0.228 0.219 s and 1.110 0.230 0.286 s.
- The first request's extra second is inside llama_decode of its prompt (py-spy on the
  server, 200 samples a second: our Python before and after it took tens of
  milliseconds). One 8-token call on each model at start, rolled back (as llama-server's
  warm-up run), did not remove it (first requests 1.35-1.64 s after it); not kept.
- Most of the start is llama.cpp clearing the KV cache of the default 32,768-token
  context (1.34 GB): 13.7 s of llama_kv_cache_unified's constructor in py-spy --native,
  where a 4,096- or 8,192-token context loads in 1.6-3.9 s. Memory first touched costs
  about 100 MB/s on this VM (a host that reclaims guest memory: kdamond runs); on other
  machines neither figure was measured.
"""
import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "ttft-trace"))
import httpx  # noqa: E402

from two_servers import ask, start, stop  # noqa: E402

from benchmarks.ttft import wait_ready  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--starts", type=int, default=2)
parser.add_argument("extra", nargs="*")
args = parser.parse_args()
base = [sys.executable, "-m", "specsample", "serve", "--parallel", "1", "--threads", "2", *args.extra]
for n in range(args.starts):
    t0 = time.perf_counter()
    procs, urls = start({"s": base}, lambda name: None)
    try:
        with httpx.Client(timeout=600) as http:
            wait_ready(http, urls["s"], procs["s"], "server exited")
            ready = time.perf_counter() - t0
            firsts = [ask(http, urls["s"], f"Say hi to person number {n}{i}.", 1)[1] for i in range(3)]
    finally:
        stop(procs)
    print(f"start {n}: ready {ready:.2f} s; requests " + " ".join(f"{f:.3f}" for f in firsts) + " s", flush=True)
