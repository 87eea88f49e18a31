"""Repeated requests with and without the suffix index (decoding/suffix.py), as a
server sees them: the same question asked twice, then a similar one, one after the
other in one process, on the default pair, greedy. Each mode keeps one planner seat
and (with the suffix source) one index across its three requests, as `serve` does.
Prints each request's new tokens, whole-request tokens/s (prefill included), time to
first token and the rounds that drafted from the suffix index.

    PYTHONPATH=src python benchmarks/scripts/suffix-repeat/run.py [--threads 2] [--max-tokens 160]
"""

import argparse

from specsample.app.assemble import ModelOptions, assemble
from specsample.decoding.generate import GenerationConfig, generate
from specsample.decoding.sampling import SamplingConfig
from specsample.decoding.suffix import SuffixIndex

ASKED = "Write a Python function that parses an ISO 8601 date string such as 2024-03-05T10:20:30Z into a datetime."
QUESTIONS = [ASKED, ASKED, ASKED.replace("into a datetime", "into a timezone-aware datetime, with a docstring")]

p = argparse.ArgumentParser()
p.add_argument("--threads", type=int, default=2)
p.add_argument("--max-tokens", type=int, default=160)
args = p.parse_args()

models = assemble(ModelOptions(threads=args.threads, ctx_size=2048))
tokenizer = models.target.tokenizer
config = GenerationConfig(max_new_tokens=args.max_tokens, sampling=SamplingConfig(0.0))
prompts = [tokenizer.chat_prompt(q) for q in QUESTIONS]
plain_texts = None
print(f"{'mode':<14} {'request':<8} {'tokens':>6} {'tok/s':>7} {'ttft s':>7} {'suffix rounds':>13}")
for mode in ("plain", "auto", "auto+suffix"):
    models.suffix = SuffixIndex(1 << 20) if mode == "auto+suffix" else None
    policy = models.policy("auto") if mode != "plain" else None
    texts = []
    for i, prompt in enumerate(prompts):
        drafter = models.drafter(config.sampling) if mode != "plain" else None
        result = generate(models.target, prompt, config, drafter, policy)
        s = result.stats
        suffix_rounds = sum(v[0] for k, v in s.sources.items() if k.startswith("suffix"))
        print(f"{mode:<14} {i + 1:<8} {s.new_tokens:>6} {s.tokens_per_second:>7.2f} {s.first_token_seconds:>7.2f} "
              f"{suffix_rounds:>13}", flush=True)
        texts.append(result.token_ids)
    if plain_texts is None:
        plain_texts = texts
    else:  # llama.cpp's default kernels move a row with the call's size, so a near tie can part them
        print(f"{mode}: the same texts as plain decoding's: {texts == plain_texts}", flush=True)
