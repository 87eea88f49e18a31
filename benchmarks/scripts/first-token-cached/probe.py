"""Before the first token, beyond the prefill: plain against -k auto, on turns that reuse a
cached prompt (as a conversation's later turns do). Prints per request: prefill s, first
token s, the gap (first token - prefill)."""
import inspect, statistics, sys, time
from specsample.app.assemble import ModelOptions, assemble
from specsample.decoding.generate import GenerationConfig, generate
from specsample.decoding.sampling import SamplingConfig

models = assemble(ModelOptions(threads=2))
tok = models.target.tokenizer
base = inspect.getsource(inspect.getmodule(statistics))[:2400]
P = tok.encode("Read this module, then answer.\n\n" + base)
print("prompt tokens", len(P), flush=True)
greedy = SamplingConfig(temperature=0.0)
cfg = GenerationConfig(max_new_tokens=3, sampling=greedy, cache_prompt=True)
policy = models.policy("auto")
drafter = models.drafter(greedy)
generate(models.target, P, cfg)  # the shared start, prefilled once
rows = {"plain": [], "auto": []}
for i in range(6):
    for mode in (("plain", "auto") if i % 2 == 0 else ("auto", "plain")):
        ids = P + tok.encode(f"\n\nQuestion {i} ({mode}): what does the function number {i + 3} return, and why?")
        if mode == "plain":
            r = generate(models.target, ids, cfg)
        else:
            r = generate(models.target, ids, cfg, drafter, policy)
        s = r.stats
        rows[mode].append((s.prefill_seconds, s.first_token_seconds, s.first_token_seconds - s.prefill_seconds, s.cached_prompt_tokens))
        print(mode, i, "cached", s.cached_prompt_tokens, "of", len(ids), "prefill %.3f first %.3f gap %.3f" % rows[mode][-1][:3], flush=True)
for mode, r in rows.items():
    print(mode, "median prefill %.3f first %.3f gap %.3f" % tuple(statistics.median(x[j] for x in r) for j in range(3)))
