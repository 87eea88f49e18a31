"""`specsample bench`: the paper's measurements on the user's models and hardware.

tasks.py      tasks: prompts, chat or raw, token limit and stop strings each
modes.py      what is timed: our loops and peer implementations, one interface
peer_sampling.py  our sampling settings in each peer's request, one table
native.py     llama.cpp's own speculative decoding: llama-server, built once
servers.py    servers run as child processes (llama-server, specsample serve)
budget.py     the run's time estimate and --budget-minutes trimming
bandwidth.py  measured read bandwidth and effective bandwidth
runner.py     interleaved runs -> one record per prompt x mode x setting x task
costs.py      the measured cost curve and the analytic speedup prediction
parity.py     HumanEval pass@1 of samples, run in a resource-limited subprocess (not a sandbox)
stats.py      percentiles, confidence intervals, per-mode aggregates
report.py     the summary's tables and notes
summary.py    records.jsonl, cost_curve.json, summary.md: one target type or several
targets.py    target types side by side (--target-quants): the overview table
rounds.py     where a round's time goes (python -m specsample.bench.rounds records.jsonl)
structured.py the structured-output task: schema, prompts, validation
plots.py      PNG plots (matplotlib Agg)
serving.py    --serve: each server under a load of streaming clients; load.py: the clients
contention.py --contention: two model processes at once, with and without core sharing
numerics.py   llama.cpp logits by call size (python -m specsample.bench.numerics)
logprob_cost.py  what log-probabilities cost in decode speed (python -m specsample.bench.logprob_cost)
harness.py    lm-evaluation-harness against specsample serve, on evaltasks/ (optional extra)
cli.py        the `bench` subcommand
"""
