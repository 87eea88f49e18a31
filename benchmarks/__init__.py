"""The research harness: measurements beside `specsample bench`, run from a checkout
(not installed with the library). It imports specsample, never the other way round
(tests/test_imports.py holds both to it).

bench.py      python -m benchmarks.bench: `specsample bench` with the research options on
              top: --modes with the peers below, --preset demo (`make demo`),
              --target-quants (targets.py: the types in turn, a table by type), plots
              (plots.py), --cost-reps (the cost curve and the analytic prediction),
              --parity-*, --budget-minutes, --neighbour, --rpc-delay-ms, --slots
native.py     llama-server as a peer, plain and -md (llamacpp-server, llamacpp-spec): the
              build llama_server.py makes, or --llama-server PATH; peer_sampling.py: our
              sampling settings in each peer's request; servers.py: servers run as child
              processes (llama-server, specsample serve)
peers.py      transformers' generate (plain, assisted) and llama-cpp-python's Llama (plain,
              prompt lookup) behind the bench's mode interface
costs.py      the measured cost curve and the analytic speedup model of Chen et al. (2023)
bandwidth.py  measured read bandwidth and effective bandwidth
parity.py     HumanEval pass@1 of samples, run in a resource-limited subprocess (not a sandbox)
budget.py     the run's time estimate and --budget-minutes trimming
neighbour.py  --neighbour: busy processes beside the run
relay.py      --rpc-delay-ms: a relay that delays every message to an RPC worker
rounds.py     the report's round-time and "What -k auto chose" tables
tasks.py      the research tasks, registered beside the bench's own: humaneval-chat,
              summarize, copy, structured (structured.py), tools (tool_task.py), fim
              (fim_task.py), and the report's sections on their answers
serving.py    --serve without --url: the servers started here (specsample serve, llama-server),
              each per --slots count, under the bench's loads; serve_run.py: the run and its
              report (our servers against llama-server); calls.py: where their time went
llama_server.py  builds the llama-server the bench compares with, once
              (python -m benchmarks.llama_server; `make demo` runs it)
ttft.py       time to first token against llama-server (python -m benchmarks.ttft)
soak.py       a mixed soak of a real `specsample serve` (python -m benchmarks.soak)
sessions.py   multi-turn agent and editor sessions (file edits, a tool loop, FIM down a file)
agents.py     those sessions against servers, turn by turn (python -m benchmarks.agents)
studies/      one-question studies, each `python -m benchmarks.studies.<name>`
scripts/      the shell and Python scripts behind some docs/results folders, one folder each
"""
