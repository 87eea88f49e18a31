"""Which of the planner's numbers move a result: each tuning number of PlannerConfig
at half and double its value, replayed (benchmarks/replay.py: the real loop and
planner, recorded models, modelled time) over the bench's cells, against the default.

    PYTHONPATH=src python -m benchmarks.sensitivity study --cells bf16-single,q4_k_m-single \\
        --out docs/results/planner-sensitivity/single.json
    PYTHONPATH=src python -m benchmarks.sensitivity table docs/results/planner-sensitivity/*.json
    PYTHONPATH=src python -m benchmarks.sensitivity record --draft DRAFT.gguf  # the recordings (loads it)

A cell is a run's 13 chat answers (docs/results/chat-bf16, chat-q4_k_m-free) on that
target's costs (replay-data/costs.json): single-stream, one answer at a time with one
planner for them all; serve, the 13 through 4 slots at once (generate_many's
scheduler). Each cell is replayed with a seeded noise on every call's cost (`--noise`,
lognormal sigma) and, as a busy neighbour, stretches of doubled costs (`--busy`); the
default is also replayed at other seeds, which is the replay's own spread. A number
"moves" a cell when half or double changes its modelled seconds by more than the
threshold (2%) and by more than that spread.

How a number is varied: integers and floats times 0.5 and 2 (integers rounded, at
least 1); tuples of them as a whole; a decay (hidden_decay) by its memory
1 / (1 - decay), halved and doubled, since 2 x 0.95 is no decay; probabilities (the
priors) clamped to [0.01, 0.99]. The numbers varied are PlannerConfig's fields (what
is derived from one moves with it: evidence moves unbar, recent_plain and probe). The
constants of policy/config.py are not: the study's earlier runs (the tree of
edb9147 and before: docs/results/planner-sensitivity) varied them and none moved a
cell, which is why they are constants. Nor is CalibrationConfig: it changes what is
measured or how many slots a server opens, not how a measured planner plans.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

from specsample.policy.config import PLANNER, PlannerConfig

from .replay import COSTS, Costs, load_recordings, play_batch, play_single

CELLS = {  # name: (recordings' run, costs' key, how it is played)
    "bf16-single": ("chat-bf16", "bf16", "single"),
    "q4_k_m-single": ("chat-q4_k_m", "q4_k_m", "single"),
    "bf16-serve4": ("chat-bf16", "bf16", "serve"),
    "q4_k_m-serve4": ("chat-q4_k_m", "q4_k_m", "serve"),
}
DECAYS = ("hidden_decay",)
PROBABILITIES = ("model_prior", "lookup_priors")
THRESHOLD = 0.02


def tuning_numbers() -> list[str]:
    return [f.name for f in dataclasses.fields(PlannerConfig)]


def scaled(name: str, value, factor: float):
    """`value` of number `name` at `factor` (0.5 or 2) as the module docstring says."""
    if isinstance(value, tuple):  # a prior keeps its positions
        return tuple(scaled(name, v, factor) for v in value)
    if name in DECAYS:
        return 1 - (1 - value) / factor
    if isinstance(value, int):
        return max(1, int(value * factor + 0.5))
    if name in PROBABILITIES:
        return min(0.99, max(0.01, value * factor))
    return value * factor


def variant(name: str, factor: float) -> PlannerConfig:
    return dataclasses.replace(PLANNER, **{name: scaled(name, getattr(PLANNER, name), factor)})


def play(cell: str, config: PlannerConfig, noise: float, busy: float, seed: int) -> dict:
    run, quant, how = CELLS[cell]
    measured = json.loads(COSTS.read_text())[quant]
    costs = Costs(measured, noise=noise, busy=busy, seed=seed)
    played = (play_single if how == "single" else play_batch)(load_recordings(run), costs, measured, config)
    return {"seconds": played.seconds, "decode_seconds": played.decode_seconds,
            "tokens_per_call": played.tokens_per_call}


def study(cells: list[str], noise: float, busy: float, seeds: int) -> dict:
    """{cell: {"default": [result per seed], "varied": {name: {"half"|"double": result}}}}."""
    out = {}
    for cell in cells:
        t0 = time.perf_counter()
        entry = {"default": [play(cell, PLANNER, noise, busy, seed) for seed in range(seeds)], "varied": {}}
        for name in tuning_numbers():
            entry["varied"][name] = {label: dict(play(cell, variant(name, factor), noise, busy, 0),
                                                 value=repr(getattr(variant(name, factor), name)))
                                     for label, factor in (("half", 0.5), ("double", 2.0))}
        out[cell] = entry
        print(f"{cell}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return out


# What the table compares: decode seconds, the prefill left out. The target's prefill is
# no planner's choice, the same calls in every variant, and under noise its few large
# calls (a 2,000-token prompt: a third of a cell's time) draw most of the spread. In a
# serve cell prompt chunks share calls with decoding: there it is the whole time.
METRIC = "decode_seconds"


def spread(defaults: list[dict]) -> float:
    """The replay's own spread: the largest relative distance of another seed's
    decode seconds from seed 0's."""
    base = defaults[0][METRIC]
    return max((abs(d[METRIC] / base - 1) for d in defaults[1:]), default=0.0)


def table(results: dict) -> str:
    """Markdown, a row per number: each cell's half and double as modelled decode
    seconds (METRIC) relative to the default's at the same seed, with the value and tokens per target
    call; "moves" where one is further from 1 than the threshold and the spread."""
    cells = list(results)
    lines = ["| number | " + " | ".join(f"{c} half | {c} double" for c in cells) + " | moves |",
             "|---|" + "---|---|" * len(cells) + "---|",
             "| default: seconds, spread (tokens/call) | " + " | ".join(
                 f"{results[c]['default'][0][METRIC]:.1f} s | spread {spread(results[c]['default']):.3f} "
                 f"({results[c]['default'][0]['tokens_per_call']:.2f})" for c in cells) + " | |"]
    for name in next(iter(results.values()))["varied"]:
        row, moves = [], False
        for c in cells:
            base, bar = results[c]["default"][0][METRIC], max(THRESHOLD, spread(results[c]["default"]))
            for label in ("half", "double"):
                v = results[c]["varied"][name][label]
                ratio = v[METRIC] / base
                moves |= abs(ratio - 1) > bar
                row.append(f"{ratio:.3f} ({v['value']}; {v['tokens_per_call']:.2f})")
        lines.append(f"| {name} | " + " | ".join(row) + f" | {'**yes**' if moves else 'no'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sensitivity", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("study", help="replay every variant over the cells; JSON out")
    s.add_argument("--cells", default=",".join(CELLS))
    s.add_argument("--noise", type=float, default=0.1, help="lognormal sigma on every call's cost")
    s.add_argument("--busy", type=float, default=0.0, help="per call, the chance a doubled stretch begins")
    s.add_argument("--seeds", type=int, default=3, help="seeds the default is replayed at (the spread)")
    s.add_argument("--out", type=Path, required=True)
    t = sub.add_parser("table", help="the markdown table of study outputs")
    t.add_argument("files", type=Path, nargs="+")
    r = sub.add_parser("record", help="make the recordings (loads the draft model)")
    r.add_argument("--draft", type=Path, required=True, help="the draft GGUF: the default pair's Q4_0 file "
                   "(~/.cache/specsample/requantized/qwen2.5-coder-0.5b-instruct-q4_k_m-*-q4_0.gguf)")
    args = parser.parse_args(argv)
    if args.command == "study":
        cells = args.cells.split(",")
        results = study(cells, args.noise, args.busy, args.seeds)
        settings = {"noise": args.noise, "busy": args.busy, "seeds": args.seeds}
        args.out.write_text(json.dumps({"settings": settings, "cells": results}, indent=1))
    elif args.command == "table":
        for path in args.files:
            data = json.loads(path.read_text())
            print(f"### {path.name}: {data['settings']}\n\n{table(data['cells'])}\n")
    else:
        record_command(args.draft)


def record_command(draft: Path) -> None:
    import gzip

    from .replay import RECORDINGS, record

    out = record(Path(__file__).resolve().parents[1], draft)
    with gzip.open(RECORDINGS, "wt") as f:
        json.dump(out, f, separators=(",", ":"))
    print(f"{len(out)} recordings -> {RECORDINGS}")


if __name__ == "__main__":
    main()
