"""python -m benchmarks: the research bench (benchmarks/bench.py); the other entry
points are `python -m benchmarks.<name>` (the package docstring lists them)."""

import sys

from benchmarks.bench import main

sys.exit(main())
