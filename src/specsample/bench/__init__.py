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
report.py     records.jsonl and summary.md
plots.py      PNG plots (matplotlib Agg)
serving.py    --serve: each server under a load of streaming clients; load.py: the clients
contention.py --contention: two model processes at once, with and without core sharing
numerics.py   llama.cpp logits by call size (python -m specsample.bench.numerics)
cli.py        the `bench` subcommand
"""
