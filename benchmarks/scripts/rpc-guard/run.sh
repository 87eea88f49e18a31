#!/usr/bin/env bash
# Issue 55: a target call over a worker --unguarded, guarded, and guarded with --rpc-key
# (measure.py). Run alone, from the repository root; the table goes to stdout.
set -euo pipefail
.venv/bin/python benchmarks/scripts/rpc-guard/measure.py "${1:-200}"
