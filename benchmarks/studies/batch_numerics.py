"""Does llama.cpp give a sequence the same logits whatever shares its call?

Under `serve --parallel` a request's step is scored in one llama_decode beside other
requests' steps (batching.py). This holds 8 sequences in one context, each a HumanEval
prompt + solution at its own length, and for 3 of them at 4 positions each scores a
1-token decode step and a 4-token verify step alone, alone again (llama.cpp is
deterministic: this must be 0), and beside 1, 3 and 7 other sequences, each of those
scoring its own next 1 to 4 tokens (OTHER_SIZES). Every row is compared with the same
row scored alone: the largest logit difference, total variation between the softmaxes
(T = 1), and how many rows change their argmax (the greedy token). The prefixes are
prefilled alone, so only the step's company differs. The default target is measured
with llama.cpp's default kernels and with --batch-invariant, and so is its BF16
re-encoding when one is cached (it is never made here).

    python -m benchmarks.studies.batch_numerics [--threads 2] [--target NAME] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .numerics import softmax_tv

SEQUENCES = 8
SUBJECTS = 3
STEPS = (1, 4)
OTHER_SIZES = (4, 1, 3, 2, 4, 1, 3)  # the others' steps: decode steps and verify steps of several K
# Company: (label, number of others, whether the measured sequence comes first in the batch).
COMPANY = (("alone, again", 0, True), ("beside 1", 1, True), ("beside 3", 3, True), ("beside 7", 7, True),
           ("beside 7, listed last", 7, False))
TAIL = 60  # each sequence waits as company this many tokens before its text's end


@dataclass
class Drift:
    """How far rows scored in company are from the same rows scored alone."""
    rows: int = 0
    max_logit_diff: float = 0.0
    tv: list[float] = field(default_factory=list)
    argmax_changed: int = 0

    def add(self, alone: torch.Tensor, batched: torch.Tensor) -> None:
        """alone, batched: [rows, vocab] logits of the same positions."""
        if alone.shape != batched.shape:
            raise ValueError(f"rows of different shapes: {tuple(alone.shape)} and {tuple(batched.shape)}")
        self.rows += len(alone)
        if len(alone):
            self.max_logit_diff = max(self.max_logit_diff, float((alone.double() - batched.double()).abs().max()))
        self.tv += [softmax_tv(a, b) for a, b in zip(alone, batched)]
        self.argmax_changed += int((alone.argmax(-1) != batched.argmax(-1)).sum())

    def cells(self) -> list[str]:
        mean_tv = sum(self.tv) / len(self.tv) if self.tv else 0.0
        return [f"{self.max_logit_diff:.4g}", f"{mean_tv:.2g} / {max(self.tv, default=0.0):.2g}",
                f"{self.argmax_changed} of {self.rows}"]


def tokens_in_call(step: int, others: int) -> int:
    return step + sum(OTHER_SIZES[:others])


def measure(backend, texts: list[list[int]], subjects: int = SUBJECTS) -> dict[tuple[int, str], Drift]:
    """(step, company label) -> Drift over `subjects` sequences at 4 positions each.
    Every other sequence waits at len - TAIL; a measured one is extended alone to its
    end first, measured at descending positions (so its prefix is never re-scored)
    and rolled back to len - TAIL after."""
    waits = [len(ids) - TAIL for ids in texts]
    for seq, ids in enumerate(texts):
        backend.rollback_sequence(seq, 0)
        backend.score_many([(seq, ids[:waits[seq]], 1)])
    drift = {(step, label): Drift() for step in STEPS for label, _, _ in COMPANY}
    for subject in range(subjects):
        ids = texts[subject]
        backend.score_many([(subject, ids[waits[subject]:], 1)])
        for n in range(len(ids) - 20, waits[subject], -10):
            for step in STEPS:
                own = (subject, ids[n:n + step], step)
                backend.rollback_sequence(subject, n)
                alone = backend.score_many([own])[0]
                for label, count, first in COMPANY:
                    others = [(subject + 1 + i) % len(texts) for i in range(count)]
                    company = [(j, texts[j][waits[j]:waits[j] + size], 1) for j, size in zip(others, OTHER_SIZES)]
                    requests = [own] + company if first else company + [own]
                    backend.rollback_sequence(subject, n)
                    rows = backend.score_many(requests)[0 if first else -1]
                    for j in others:
                        backend.rollback_sequence(j, waits[j])
                    drift[step, label].add(alone, rows)
        backend.rollback_sequence(subject, waits[subject])
    return drift


def models(target: str) -> list[tuple[str, Path]]:
    """The target's GGUF file, and its BF16 re-encoding where one is cached."""
    from specsample.backends.models import resolve
    from specsample.backends.reencode import cached_reencoding

    path = resolve(target).gguf_path
    found = [(f"{target} ({path.name})", path)]
    bf16 = cached_reencoding(path, "bf16")
    if bf16 is not None:
        found.append((f"{target} BF16 re-encoding", bf16))
    else:
        print(f"no cached BF16 re-encoding of {path.name}: measuring the GGUF file only", file=sys.stderr)
    return found


def main(argv=None) -> None:
    from specsample.backends.llamacpp import LlamaCppBackend
    from specsample.backends.models import DEFAULT_TARGET
    from specsample.bench import humaneval_problems, machine_description, markdown_table

    p = argparse.ArgumentParser(prog="python -m benchmarks.studies.batch_numerics", description=__doc__.splitlines()[0])
    p.add_argument("--target", default=DEFAULT_TARGET)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, help="also write batch-composition.md here")
    args = p.parse_args(argv)
    command = "python -m benchmarks.studies.batch_numerics " + " ".join(argv if argv is not None else sys.argv[1:])
    problems = humaneval_problems()[:SEQUENCES]
    rows = [["model", "kernels", "step", "company", "tokens in the call", "max logit diff", "TV mean / max",
             "argmax changed"]]
    for name, path in models(args.target):
        for kernels, invariant in (("default", False), ("--batch-invariant", True)):
            backend = LlamaCppBackend(path, threads=args.threads, share_cores=False, batch_invariant=invariant,
                                      sequences=SEQUENCES, n_ctx=512)
            texts = [backend.tokenizer.encode(q["prompt"] + q["canonical_solution"]) for q in problems]
            for (step, label), d in measure(backend, texts).items():
                others = next(count for company, count, _ in COMPANY if company == label)
                rows.append([name, kernels, f"{step} token{'s' if step > 1 else ''}", label,
                             str(tokens_in_call(step, others)), *d.cells()])
                print(" | ".join(rows[-1]), flush=True)
            del backend
    lengths = ", ".join(str(len(t)) for t in texts)
    about = (f"{SEQUENCES} sequences in one context (HumanEval/0-{SEQUENCES - 1} prompt + solution: {lengths} tokens); "
             f"rows of sequences 0-{SUBJECTS - 1}, 4 positions each (every 10 tokens from 20 before the end); "
             f"the others score their next {', '.join(map(str, OTHER_SIZES))} tokens; threads {args.threads}")
    machine = machine_description("gguf", args.threads)
    report = f"Command: `{command}`\n\nMachine: {machine}\n\n{about}\n\n{markdown_table(rows)}\n"
    print()
    print(report)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "batch-composition.md").write_text("# llama.cpp logits by batch composition\n\n" + report)


if __name__ == "__main__":
    main()
