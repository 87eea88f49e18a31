#!/usr/bin/env bash
# Issue 26's measurement: the BF16 target split over two local RPC workers (2 threads
# each), as it is and behind 0.5, 2 and 5 ms of one-way delay, then in one process;
# then -k auto with a higher ceiling at 2 and 5 ms, and `specsample check` on the
# default pair split over the workers. Run alone, from the repository root (the bench is
# the research one, python -m benchmarks.bench: --rpc-delay-ms and --no-parity are its); the
# results go to $OUT (default /tmp/rpc2) and the ones the docs cite are in docs/results/rpc.
set -euo pipefail
OUT=${OUT:-/tmp/rpc2}
mkdir -p "$OUT"
.venv/bin/specsample rpc-worker --port 50071 --threads 2 > "$OUT/w1.log" 2>&1 & W1=$!
.venv/bin/specsample rpc-worker --port 50072 --threads 2 > "$OUT/w2.log" 2>&1 & W2=$!
trap 'kill $W1 $W2 2>/dev/null' EXIT
sleep 3
WORKERS="--target-rpc 127.0.0.1:50071,127.0.0.1:50072 --tensor-split 1,1"
BENCH=".venv/bin/python -m benchmarks.bench --backend llamacpp --threads 2 --target-quant bf16 --tasks humaneval --prompts 8 --settings greedy,sample --no-parity --no-plots"
SWEEP="--modes ar,spec-auto,spec --ks 1,2,4,8"
for d in none 0.5 2 5; do
  delay=$([ "$d" = none ] && echo "" || echo "--rpc-delay-ms $d")
  $BENCH $SWEEP $WORKERS $delay --out "$OUT/delay-$d" > "$OUT/delay-$d.log" 2>&1
  echo "done delay $d $(date)" >> "$OUT/progress"
done
for d in 2 5; do
  $BENCH --modes ar,spec-auto --k-max 16 $WORKERS --rpc-delay-ms $d --out "$OUT/kmax16-delay-$d" > "$OUT/kmax16-delay-$d.log" 2>&1
  echo "done k-max 16 delay $d $(date)" >> "$OUT/progress"
done
.venv/bin/specsample check --threads 2 $WORKERS -n 2000 > "$OUT/check.txt" 2> "$OUT/check.log"
echo "done check $(date)" >> "$OUT/progress"
kill $W1 $W2
trap - EXIT
$BENCH $SWEEP --out "$OUT/local" > "$OUT/local.log" 2>&1
echo "done local $(date)" >> "$OUT/progress"
