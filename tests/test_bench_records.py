"""Records on disk: every records file committed under docs/results/ reads back into
Records and writes out byte for byte as it was, so old runs stay readable (the report,
studies.rounds) and new runs write the same format."""

import json
from pathlib import Path

import pytest

from specsample.bench.records import Record, read_records
from specsample.bench.report import write_records
from specsample.bench.serving import ServedRecord

from bench_helpers import record

RESULTS = Path(__file__).parents[1] / "docs" / "results"

pytestmark = pytest.mark.pure


@pytest.mark.parametrize("path", sorted(RESULTS.glob("*/records.jsonl")), ids=lambda p: p.parent.name)
def test_a_committed_records_file_reads_and_writes_back_unchanged(path, tmp_path):
    records = read_records(path)
    assert records and all(isinstance(r, Record) for r in records)
    write_records(tmp_path / "records.jsonl", records)
    assert (tmp_path / "records.jsonl").read_bytes() == path.read_bytes()


def test_the_committed_serve_records_read_and_write_back_unchanged(tmp_path):
    path = RESULTS / "serve" / "serve.jsonl"
    records = [ServedRecord.from_json(json.loads(line)) for line in path.read_text().splitlines()]
    write_records(tmp_path / "serve.jsonl", records)
    assert (tmp_path / "serve.jsonl").read_bytes() == path.read_bytes()


def test_optional_fields_are_written_only_when_set():
    plain = record().to_json()
    assert list(plain)[-1] == "text" and "valid" not in plain and plain["k"] is None  # k is always written
    parity = record(phase="parity", passed=False, outcome="failed: AssertionError", target="bf16").to_json()
    assert list(parity)[-4:] == ["text", "passed", "outcome", "target"] and parity["passed"] is False
    assert Record.from_json(parity) == record(phase="parity", passed=False, outcome="failed: AssertionError",
                                              target="bf16")
