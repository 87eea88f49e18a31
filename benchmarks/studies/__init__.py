"""One-off studies: measurements tied to past questions, each runnable on its own and
none run by `specsample bench` (benchmarks/bench.py extends that). Each writes or prints its own
report; docs/ names the question each answered and its result.

rounds.py        where a round's time goes, from any run's records.jsonl
                 (python -m benchmarks.studies.rounds RECORDS.jsonl)
numerics.py      llama.cpp logits by call size under each engine setting
                 (python -m benchmarks.studies.numerics)
batch_numerics.py  llama.cpp logits of one sequence by what shares its call (serve
                 --parallel), default and batch-invariant kernels
                 (python -m benchmarks.studies.batch_numerics --out DIR)
logprob_cost.py  what log-probabilities cost in decode speed
                 (python -m benchmarks.studies.logprob_cost --out DIR)
seeded.py        a seed's text across real `specsample serve` processes, default and
                 batch-invariant kernels (python -m benchmarks.studies.seeded --out DIR)
second_token.py  time to the second token on a long prompt, plain against -k auto
                 (python -m benchmarks.studies.second_token --out DIR)
prompt_cache.py  what cache_prompt saves a chat's later turns in time to first token
                 (python -m benchmarks.studies.prompt_cache --out DIR)
contention.py    how two model processes at once slow each other, with and without
                 the library's core sharing (python -m benchmarks.studies.contention --out DIR)
harness.py       lm-evaluation-harness against `specsample serve` on evaltasks/, the
                 eval extra (python -m benchmarks.studies.harness --out DIR)
"""
