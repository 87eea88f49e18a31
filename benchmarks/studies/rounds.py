"""Where a round of our loop spends its time, for any run's records: the table of
summary.md's "Where a round's time goes", per target type of the run.

    python -m benchmarks.studies.rounds docs/results/target-types/records.jsonl
"""

from __future__ import annotations

import sys

from specsample.bench import read_records

from ..rounds import round_time_table


def main(argv: list[str] | None = None) -> int:
    paths = argv if argv is not None else sys.argv[1:]
    if not paths:
        print("usage: python -m benchmarks.studies.rounds RECORDS.jsonl [...]", file=sys.stderr)
        return 2
    for path in paths:
        by_target: dict[str, list] = {}
        for r in read_records(path):
            if r.phase == "main":
                by_target.setdefault(r.target or "-", []).append(r)
        for target, group in by_target.items():
            print(f"{path}, target {target}:\n{round_time_table(group) or 'no rounds of our loop'}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
