"""Expected drafts kept per round under block and token-by-token verification, on the
same rounds of real generations: each round's drafts are verified by block
verification as generate does, and beside it both rules' expected kept counts are
computed exactly from that round's rows (verify.block_acceptance; the token rule's
products of min(1, target / draft)), so the comparison carries no verifier noise.

    PYTHONPATH=src python benchmarks/scripts/block-verify/expected_kept.py --k 4 --prompts 8 --tokens 128
"""

import argparse
import json
import math

import torch

from specsample.backends import load_backend
from specsample.backends.models import DEFAULT_DRAFT, DEFAULT_TARGET
from specsample.bench.modes import SETTINGS
from specsample.bench.runner import prepare
from specsample.decoding import rounds
from specsample.decoding.drafters import ModelDrafter
from specsample.decoding.generate import GenerationConfig, generate
from specsample.decoding.verify import block_acceptance, verify_block


def expected_kept(draft_tokens, draft_probs, target_probs) -> tuple[float, float]:
    """(block, token): the expected number of drafts each rule keeps on this round."""
    draft_probs, target_probs = draft_probs.float(), target_probs.float()
    _, stops = block_acceptance(draft_tokens, draft_probs, target_probs)
    stops = stops.double().tolist()
    k = len(stops)
    block = sum(n * stops[n - 1] * math.prod(1 - s for s in stops[n:]) for n in range(1, k + 1))
    positions = torch.arange(k)
    ratios = (target_probs[positions, draft_tokens] / draft_probs[positions, draft_tokens]).clamp(max=1).tolist()
    token = sum(math.prod(ratios[:n]) for n in range(1, k + 1))
    return block, token


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--task", default="humaneval")
    args = parser.parse_args()
    target, draft = load_backend(DEFAULT_TARGET, "llamacpp"), load_backend(DEFAULT_DRAFT, "llamacpp")
    sampling = SETTINGS["sample"]
    rows = []

    def observed(draft_tokens, draft_probs, target_probs, generator):
        rows.append(expected_kept(draft_tokens, draft_probs, target_probs))
        return verify_block(draft_tokens, draft_probs, target_probs, generator)

    rounds.verify_block = observed
    for i, prompt in enumerate(prepare(target, (args.task,), {args.task: args.prompts})[args.task]):
        config = GenerationConfig(max_new_tokens=args.tokens, sampling=sampling, seed=i, verifier="block",
                                  stop_strings=tuple(prompt.task.stop_strings))
        generate(target, prompt.ids, config, ModelDrafter(draft, sampling), args.k)
    block = sum(b for b, _ in rows) / len(rows)
    token = sum(t for _, t in rows) / len(rows)
    print(json.dumps({"task": args.task, "setting": "sample", "k": args.k, "rounds": len(rows),
                      "expected_kept_block": round(block, 4), "expected_kept_token": round(token, 4),
                      "tokens_per_call_block": round(block + 1, 4), "tokens_per_call_token": round(token + 1, 4),
                      "gain": round((block + 1) / (token + 1) - 1, 4)}))


if __name__ == "__main__":
    main()
