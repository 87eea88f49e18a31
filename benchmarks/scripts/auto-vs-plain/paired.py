"""-k auto against plain decoding in one process, on the default Q4_K_M pair, greedy, 96
tokens at most, three chat prompts (a story, a translation, code), the two modes in
alternating order each repetition: decode seconds per token (total less prefill) and
the split of a generation's time (stats: target calls, draft, other).

    PYTHONPATH=src python benchmarks/scripts/auto-vs-plain/paired.py REPS

What it showed (2026-12-07, 2-core AMD EPYC, alone under the lock, main at d8d4f5a, 6
repetitions, 18 pairs, 1,308 tokens a mode): `-k auto` stepped plain in every round, as
plain decoding does (1,290 target calls each). Its own costs beside the same calls:
0.45 ms a token of the draft model (the prompt's reading; 0.02 ms in plain decoding's
stats) and 0.15 ms a token more of other work, about 1.1% of a 55 ms token. The paired
ratios of decode time per token (auto / plain) ran from 0.874 to 1.239, median 0.998:
the same target calls took 53.7 and 54.5 ms (medians) in the two modes, so this
machine's noise is ten times the planner's cost here.
"""
import statistics, sys, time
from specsample.app.assemble import ModelOptions, assemble
from specsample.decoding.generate import GenerationConfig, generate
from specsample.decoding.sampling import SamplingConfig
G = SamplingConfig(temperature=0)
models = assemble(ModelOptions(threads=2), drafting=True)
policy = models.policy("auto")
target = models.target
prompts = [target.tokenizer.chat_prompt(t) for t in (
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Translate into French: The weather was cold, so we stayed inside and read books all afternoon.",
    "Write a Python function that merges two sorted lists.")]
res = {"ar": [], "auto": []}
for rep in range(int(sys.argv[1])):
    for p in prompts:
        for mode in (("ar", "auto") if rep % 2 == 0 else ("auto", "ar")):
            cfg = GenerationConfig(max_new_tokens=96, sampling=G)
            r = generate(target, p, cfg) if mode == "ar" else generate(target, p, cfg, models.drafter(G), policy)
            s = r.stats
            dec = (s.total_seconds - s.prefill_seconds) / max(1, s.new_tokens - 1)
            res[mode].append((dec, s.target_seconds / max(1, s.target_calls), s.other_seconds / max(1, s.new_tokens), s.draft_seconds, s.plain_rounds, s.target_calls, s.new_tokens))
            print(mode, f"decode {dec*1000:.1f} ms/token, target {s.target_seconds/max(1,s.target_calls)*1000:.1f} ms/call, other {s.other_seconds/max(1,s.new_tokens)*1000:.2f} ms/token, draft {s.draft_seconds:.3f} s, plain {s.plain_rounds}/{s.target_calls}, tokens {s.new_tokens}", flush=True)
pairs = [a[0] / b[0] for a, b in zip(res["auto"], res["ar"])]
print("auto/ar decode time per token, paired:", " ".join(f"{x:.3f}" for x in pairs), "median", f"{statistics.median(pairs):.3f}")
