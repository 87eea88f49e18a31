"""Two model processes on one machine: how much each slows the other.

A user runs a server beside a notebook, or two jobs at once. OpenMP runtimes spin
at their barriers, and on a machine with no spare core a spinning thread burns the
time slice its descheduled partner needs: llama.cpp calls can run many times slower
in pairs (docs/benchmarks.md, "Two processes at once").
This measures it: each worker process loads the pair once, waits until all
workers are loaded, then draws the same speculative samples through the public
API; we compare the median sample time of a pair of workers with that of one.

    python -m benchmarks.studies.contention --backend llamacpp --threads 2 --out docs/results/contention

`python -m benchmarks.studies.contention WORKER ...` is the worker (model arguments,
then --reps and --tokens); the environment passed to it is the configuration
under test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from specsample.bench import markdown_table
from specsample.processes import dies_with_parent

# Seconds a set of workers may take to load and sample, all together: room for a
# pair's samples with fixed threads on the transformers backend, the slowest
# configuration (docs/results/contention-hf), plus the loads.
WORKER_TIMEOUT = 1800.0
PROMPT = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"


@dataclass
class Contention:
    label: str
    lone: float  # median seconds per sample, one worker
    paired: float  # median over both workers' samples, two at once

    @property
    def slowdown(self) -> float:
        return self.paired / self.lone


def measure(model_argv: list[str], label: str, env: dict[str, str] | None = None, reps: int = 6,
            tokens: int = 32, timeout: float = WORKER_TIMEOUT) -> Contention:
    cmd = [sys.executable, "-m", "benchmarks.studies.contention", "WORKER", *model_argv, "--reps", str(reps),
           "--tokens", str(tokens)]
    lone = _run_workers(1, cmd, env, timeout)
    paired = _run_workers(2, cmd, env, timeout)
    return Contention(label, statistics.median(lone), statistics.median(paired))


# What the study compares: the library as shipped, then the same with its
# core sharing off (OpenMP's own waits, as other llama.cpp programs run), then
# passive OpenMP waits, the usual advice for shared machines.
CONFIGURATIONS = (
    ("specsample (threads follow the free cores)", {"SPECSAMPLE_SHARE_CORES": "1"}),
    ("fixed threads (SPECSAMPLE_SHARE_CORES=0)", {"SPECSAMPLE_SHARE_CORES": "0"}),
    ("fixed threads, OMP_WAIT_POLICY=PASSIVE", {"SPECSAMPLE_SHARE_CORES": "0", "OMP_WAIT_POLICY": "PASSIVE"}),
)
NOTE = ("Each worker process loads the pair, draws one warm-up sample, waits until every worker is loaded, then draws "
        "{reps} speculative samples (K = 3, T = 0.8, top-p 0.95, {tokens} new tokens each, seeds 0..{last}) from a "
        "short code prompt. Medians over the samples of one worker alone, and over both workers' samples when two run "
        "at once.")


def contention_sections(results: list[Contention], reps: int, tokens: int) -> tuple[list[str], str]:
    """contention.md's sections, and its table (which the command line prints)."""
    table = contention_table(results)
    return [NOTE.format(reps=reps, tokens=tokens, last=reps - 1), table], table


def contention_table(results: list[Contention]) -> str:
    base = results[0].lone
    rows = [["configuration", "one process: s/sample", "two at once: s/sample", "slowdown in a pair",
             "alone, vs the first row"]]
    rows += [[c.label, f"{c.lone:.3f}", f"{c.paired:.3f}", f"{c.slowdown:.2f}x", f"{c.lone / base:.2f}x"]
             for c in results]
    return markdown_table(rows)


def main(argv: list[str] | None = None) -> int:
    """Each configuration, one worker alone then two at once; contention.md in --out."""
    from specsample.app.arguments import add_model_arguments, model_options
    from specsample.bench import BENCH_CONTEXT, machine_description, threads

    p = argparse.ArgumentParser(prog="python -m benchmarks.studies.contention", description=__doc__.splitlines()[0])
    add_model_arguments(p)
    p.set_defaults(ctx_size=BENCH_CONTEXT)  # the bench's: a short prompt needs no more
    p.add_argument("--reps", type=int, default=6, help="timed samples per worker (default 6)")
    p.add_argument("--tokens", type=int, default=32, help="new tokens per sample (default 32)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    results = []
    for label, env in CONFIGURATIONS:
        print(f"contention: {label}", file=sys.stderr, flush=True)
        results.append(measure(model_options(args).argv(), label, env, reps=args.reps, tokens=args.tokens))
    machine = machine_description("gguf" if args.backend != "hf" else args.dtype, threads(args))
    sections, table = contention_sections(results, args.reps, args.tokens)
    command = "python -m benchmarks.studies.contention " + " ".join(argv if argv is not None else sys.argv[1:])
    args.out.mkdir(parents=True, exist_ok=True)
    parts = ["# Two model processes at once", f"Command: `{command}`", f"Machine: {machine}", *sections]
    (args.out / "contention.md").write_text("\n\n".join(parts) + "\n")
    print(table)
    return 0


def _run_workers(n: int, cmd: list[str], env, timeout: float) -> list[float]:
    """Start n workers, release them together once all are loaded, gather sample
    times; kill them all if they take longer than `timeout` seconds in all."""
    full_env = {**os.environ, **(env or {})}
    workers = [subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=full_env,
                                preexec_fn=dies_with_parent()) for _ in range(n)]
    expired = threading.Event()

    def kill_all() -> None:
        expired.set()
        for w in workers:
            w.kill()

    watchdog = threading.Timer(timeout, kill_all)
    watchdog.start()
    try:
        for w in workers:
            if _line(w, expired, timeout).strip() != "ready":
                raise RuntimeError(f"a contention worker failed to load (exit {w.wait()})")
        for w in workers:
            w.stdin.write("go\n")
            w.stdin.flush()
        times = []
        for w in workers:
            times += json.loads(_line(w, expired, timeout))
            w.wait()
        return times
    finally:
        watchdog.cancel()
        for w in workers:
            if w.poll() is None:
                w.kill()
            w.wait()


def _line(worker, expired: threading.Event, timeout: float) -> str:
    line = worker.stdout.readline()  # "" once the watchdog killed it
    if expired.is_set():
        raise RuntimeError(f"contention workers did not finish within {timeout:.0f} s; killed them")
    return line


def _worker(argv: list[str]) -> None:
    import argparse

    from specsample.app.arguments import add_model_arguments, model_options
    from specsample.app.assemble import assemble
    from specsample.decoding.generate import GenerationConfig, generate
    from specsample.decoding.sampling import SamplingConfig

    p = argparse.ArgumentParser()
    add_model_arguments(p)
    p.add_argument("--reps", type=int, default=6)
    p.add_argument("--tokens", type=int, default=32)
    args = p.parse_args(argv)
    sampling = SamplingConfig(temperature=0.8, top_k=0, top_p=0.95)
    models = assemble(model_options(args))
    target, drafter = models.target, models.drafter(sampling)
    ids = target.tokenizer.encode(PROMPT)

    def sample(seed: int) -> float:
        config = GenerationConfig(max_new_tokens=args.tokens, sampling=sampling, seed=seed)
        return generate(target, ids, config, drafter, 3).stats.total_seconds

    sample(-1 % (1 << 32))  # warm-up: first-call costs are not contention
    print("ready", flush=True)
    sys.stdin.readline()
    print(json.dumps([sample(seed) for seed in range(args.reps)]), flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["WORKER"]:
        _worker(sys.argv[2:])
    else:
        sys.exit(main())
