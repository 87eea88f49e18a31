"""What the guard in front of a worker costs per call (issue 55): the 0.5B model's
layers on one local worker (1 thread) started --unguarded, guarded, and guarded with
--rpc-key (the client through its key relay), timed in turns: a target call of 1 token
and one of 8, median of N each. Run from the repository root with run.sh."""

import gc
import statistics
import subprocess
import sys
import time

from specsample.backends import load_backend
from specsample.backends.rpc import WorkerError, parse_workers, probe

N = int(sys.argv[1]) if len(sys.argv) > 1 else 200
KINDS = {"unguarded": ["--unguarded"], "guarded": [], "guarded+key": ["--rpc-key", "measure"]}


def start(port: int, flags: list[str]) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "specsample", "rpc-worker", "--port", str(port), "--threads", "1",
                             *flags], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(2)
    return proc


procs, models = [], {}
try:
    for i, (kind, flags) in enumerate(KINDS.items()):
        port = 50191 + i
        procs.append(start(port, flags))
        workers = parse_workers(f"127.0.0.1:{port}", secret="measure" if "key" in kind else None)
        for _ in range(100):
            try:
                probe(workers.endpoints[0]) if "key" not in kind else None
                break
            except WorkerError:
                time.sleep(0.2)
        models[kind] = load_backend("qwen2.5-coder-0.5b", "llamacpp", threads=1, workers=workers, n_ctx=512)
    prompt = models["guarded"].tokenizer.encode("def fibonacci(n):\n")
    times = {(kind, n): [] for kind in KINDS for n in (1, 8)}
    for model in models.values():
        model.score(prompt, 1)
    for _ in range(N):  # in turns, so drift on the machine falls on every kind alike
        for n in (1, 8):
            for kind, model in models.items():
                model.rollback(len(prompt))
                start_time = time.perf_counter()
                model.score(list(range(1000, 1000 + n)), n)
                times[(kind, n)].append(time.perf_counter() - start_time)
    print(f"median ms per target call, N={N} each, 0.5B model on one local worker of 1 thread")
    for n in (1, 8):
        base = statistics.median(times[("unguarded", n)])
        row = ", ".join(f"{kind} {statistics.median(times[(kind, n)]) * 1000:.2f}"
                        f" (+{(statistics.median(times[(kind, n)]) - base) * 1000:.2f})" for kind in KINDS)
        print(f"  {n} token(s): {row}")
finally:
    models.clear()
    gc.collect()  # freed while the workers answer
    for proc in procs:
        proc.kill()
