#!/usr/bin/env bash
# Issue 44's measurement: drafting during the target's call (decoding/overlap.py) on the
# BF16 target split over two local RPC workers, with the overlap on (the default for a
# target on workers) and off (--no-overlap), beside plain decoding on the same workers.
#
# Layouts:
#   pinned: both workers (1 thread each) on core 0, the client (bench, draft, sampling,
#           the delay relays) on core 1 (taskset), as if the workers were other machines;
#   shared: today's layout of benchmarks/scripts/rpc/run.sh, workers of 2 threads and a client
#           of 2 threads all on both cores.
# Cells are layout:delay-ms (CELLS="pinned:2 shared:none"; default all of the issue's).
# The delay (benchmarks/relay.py's DelayRelay: every message one way) runs in a process of its
# own, on the workers' core when pinned: in the client's process its Python thread would
# wait on the drafting thread for the GIL at every message, a cost no network has.
# Each cell runs `--modes ar,spec-auto` twice (overlap on, then off), greedy and
# sampled, HumanEval 8 prompts. The layout "draft" (cell draft:none) is --draft-rpc's:
# the target in the client on core 0 (1 thread), the draft on a worker of its own on
# core 1, against the same run with the draft in the client beside the target. CHECK=1 ends with `specsample check` over the pinned
# workers (overlap on: check runs the overlapped rounds). Run alone, from the
# repository root (the bench is python -m benchmarks.bench, the relay benchmarks.relay); results go to $OUT (default /tmp/rpc-overlap) and the ones the docs cite are in docs/results/rpc-overlap.
set -euo pipefail
OUT=${OUT:-/tmp/rpc-overlap}
CELLS=${CELLS:-"pinned:none pinned:2 pinned:5 shared:none shared:2 shared:5"}
PROMPTS=${PROMPTS:-8}
CHECK=${CHECK:-0}
CHECK_N=${CHECK_N:-2000}
SPEC=${SPEC:-.venv/bin/specsample}
PYTHON=${PYTHON:-.venv/bin/python}
mkdir -p "$OUT"
W1= W2= LAYOUT=
stop_workers() {
  [ -n "$W1" ] && kill "$W1" "$W2" 2>/dev/null && wait "$W1" "$W2" 2>/dev/null || true
  W1= W2= LAYOUT=
}
start_workers() {  # $1: layout
  [ "$LAYOUT" = "$1" ] && return
  stop_workers
  if [ "$1" = pinned ]; then pin="taskset -c 0" threads=1; else pin="" threads=2; fi
  $pin $SPEC rpc-worker --port 50071 --threads $threads > "$OUT/w1-$1.log" 2>&1 & W1=$!
  $pin $SPEC rpc-worker --port 50072 --threads $threads > "$OUT/w2-$1.log" 2>&1 & W2=$!
  LAYOUT=$1
  sleep 3
}
ENDPOINTS=127.0.0.1:50071,127.0.0.1:50072
RELAY='
import sys, threading, contextlib
from benchmarks.relay import DelayRelay
with contextlib.ExitStack() as stack:
    relays = [stack.enter_context(DelayRelay(e, float(sys.argv[2]) / 1000)) for e in sys.argv[1].split(",")]
    print(",".join(r.endpoint for r in relays), flush=True)
    threading.Event().wait()
'
R=
start_relay() {  # $1: pin prefix, $2: delay ms; sets TARGET to the relays' endpoints
  $1 $PYTHON -c "$RELAY" "$ENDPOINTS" "$2" > "$OUT/relay.endpoints" & R=$!
  for _ in $(seq 300); do [ -s "$OUT/relay.endpoints" ] && break; sleep 0.2; done
  TARGET=$(head -1 "$OUT/relay.endpoints")
}
stop_relay() { [ -n "$R" ] && kill "$R" 2>/dev/null && wait "$R" 2>/dev/null || true; R=; rm -f "$OUT/relay.endpoints"; }
trap 'stop_relay; stop_workers' EXIT
BENCH="$PYTHON -m benchmarks.bench --backend llamacpp --target-quant bf16 --tasks humaneval --prompts $PROMPTS --settings greedy,sample --no-parity --no-plots --modes ar,spec-auto ${EXTRA:-}"
for cell in $CELLS; do
  layout=${cell%%:*} d=${cell#*:}
  if [ "$layout" = draft ]; then
    stop_workers
    taskset -c 1 $SPEC rpc-worker --port 50073 --threads 1 > "$OUT/w3-draft.log" 2>&1 & W3=$!
    sleep 3
    for where in draft-rpc draft-here; do
      name="draft-delay-$d-$where"
      rpc=""; [ "$where" = draft-rpc ] && rpc="--draft-rpc 127.0.0.1:50073"
      [ "$d" = none ] || rpc="$rpc --rpc-delay-ms $d"
      taskset -c 0 $BENCH --threads 1 $rpc --out "$OUT/$name" > "$OUT/$name.log" 2>&1
      echo "done $name $(date -u +%H:%M:%S)" >> "$OUT/progress"
    done
    kill "$W3" 2>/dev/null && wait "$W3" 2>/dev/null || true
    continue
  fi
  start_workers "$layout"
  if [ "$layout" = pinned ]; then head="taskset -c 1" threads=1 net="taskset -c 0"; else head="" threads=2 net=""; fi
  TARGET=$ENDPOINTS
  [ "$d" = none ] || start_relay "$net" "$d"
  for overlap in overlap no-overlap; do
    name="$layout-delay-$d-$overlap"
    $head $BENCH --threads $threads --$overlap --target-rpc "$TARGET" --tensor-split 1,1 --out "$OUT/$name" \
      > "$OUT/$name.log" 2>&1
    echo "done $name $(date -u +%H:%M:%S)" >> "$OUT/progress"
  done
  stop_relay
done
if [ "$CHECK" = 1 ]; then
  start_workers pinned
  taskset -c 1 $SPEC check --threads 1 --target-rpc "$ENDPOINTS" --tensor-split 1,1 -n "$CHECK_N" \
    > "$OUT/check.txt" 2> "$OUT/check.log"
  echo "done check $(date -u +%H:%M:%S)" >> "$OUT/progress"
fi
