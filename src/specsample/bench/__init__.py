"""`specsample bench`: the paper's measurements on the user's models and hardware.
Everything here is run by that command; one-off studies live in specsample.studies.

cli.py        the `bench` subcommand: its parser, and the run its options ask for
options.py    its options, and what they name: target types, draft lengths, files, the
              native server, the report's command and machine lines
sequence_run.py  the per-sequence run: each target type's cost curve, then every mode
serve_run.py  --serve: each server in turn under concurrent clients
tasks.py      tasks: prompts, chat or raw, token limit and stop strings each
structured.py the structured-output task: schema, prompts, validation
fim_task.py   the fill-in-the-middle task; tool_task.py: the tool-call task
modes.py      what is timed: our loops and peer implementations, one interface
peer_sampling.py  our sampling settings in each peer's request, one table
native.py     llama.cpp's own speculative decoding: llama-server, built once
servers.py    servers run as child processes (llama-server, specsample serve)
budget.py     the run's time estimate and --budget-minutes trimming
bandwidth.py  measured read bandwidth and effective bandwidth
runner.py     interleaved runs -> one Record per prompt x mode x setting x task
records.py    Record: one timed generation, a line of records.jsonl; ServedRecord: one
              request of a --serve load, a line of serve.jsonl
costs.py      the measured cost curve and the analytic speedup prediction
parity.py     HumanEval pass@1 of samples, run in a resource-limited subprocess (not a sandbox)
stats.py      percentiles, confidence intervals, per-mode aggregates
tables.py     the reports' tables and notes, as markdown
summary.py    summary.md's sections for one target type
targets.py    target types side by side (--target-quants): the overview table
plots.py      the report's figures (matplotlib Agg)
report.py     the one writer of the output folder: records, curves, markdown, plots
serving.py    --serve: each server, per slot count, under loads of streaming clients;
              load.py: the clients and a load's figures; calls.py: where a load's time went
              in our server; serve_summary.py: serve.md's tables
endpoints.py  bench serve --url: the same loads against endpoints the user runs
neighbour.py  --neighbour: busy processes beside the run
relay.py      --rpc-delay-ms: a relay that delays every message to an RPC worker
"""
