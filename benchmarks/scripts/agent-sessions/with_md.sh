#!/usr/bin/env bash
# The agent sessions (python -m benchmarks.agents) on our three servers and on
# `llama-server -m TARGET -md DRAFT` with its own drafting defaults (draft-max 16,
# draft-min 0, p-min 0.8), as a user would run it: the same files (the default pair's
# target, the requantized Q4_0 draft our servers load), one slot, the same context
# and threads, --jinja for tool calls.
#   benchmarks/scripts/agent-sessions/with_md.sh OUT [agents.py flags...]
# Run from the checkout, alone (flock /tmp/cpu.lock ...); the model files must be
# fetched (make fetch) and llama-server built (python -m benchmarks.llama_server).
set -eu
out=${1:?usage: with_md.sh OUT [flags for python -m benchmarks.agents]}; shift
py=${PYTHON:-.venv/bin/python}
read -r target draft binary < <(PYTHONPATH=src:. "$py" - <<'PY'
from benchmarks.native import server_path
from specsample.backends.models import DEFAULT_DRAFT, DEFAULT_TARGET, resolve
from specsample.backends.reencode import reencoded
print(resolve(DEFAULT_TARGET).gguf_path, reencoded(resolve(DEFAULT_DRAFT).gguf_path, "q4_0"), server_path())
PY
)
port=$(( 20000 + RANDOM % 20000 ))
"$binary" -m "$target" -md "$draft" -t 2 -tb 2 -td 2 -tbd 2 -c 8192 -cd 8192 -np 1 -ngl 0 -ngld 0 \
    --host 127.0.0.1 --port "$port" --jinja --no-webui > "$out.llama-server.log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null; wait "$server" 2>/dev/null' EXIT
for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$port/health" > /dev/null && break
    kill -0 "$server" || { echo "llama-server exited: $out.llama-server.log" >&2; exit 1; }
    sleep 1
done
PYTHONPATH=src:. "$py" -m benchmarks.agents --out "$out" --servers plain,auto,suffix --url "md=http://127.0.0.1:$port" "$@"
