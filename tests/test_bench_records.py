"""Records on disk: every records file committed under docs/results/ reads back into
Records and writes out byte for byte as it was, so old runs stay readable (the report,
benchmarks.studies.rounds) and new runs write the same format."""

import json
from pathlib import Path

import pytest

from specsample.bench.records import Record, RequestTiming, ServedRecord, read_records
from specsample.bench.report import write_records

from bench_helpers import record

RESULTS = Path(__file__).parents[1] / "docs" / "results"

pytestmark = pytest.mark.pure


def read_served_records(path: Path) -> list[ServedRecord]:
    return [ServedRecord.from_json(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("path", sorted(RESULTS.glob("*/records.jsonl")), ids=lambda p: p.parent.name)
def test_a_committed_records_file_reads_and_writes_back_unchanged(path, tmp_path):
    records = read_records(path)
    assert records and all(isinstance(r, Record) for r in records)
    write_records(tmp_path / "records.jsonl", records)
    assert (tmp_path / "records.jsonl").read_bytes() == path.read_bytes()


@pytest.mark.parametrize("path", sorted(RESULTS.glob("*/serve.jsonl")), ids=lambda p: p.parent.name)
def test_a_committed_serve_records_file_reads_and_writes_back_unchanged(path, tmp_path):
    records = read_served_records(path)
    assert records and all(isinstance(r, ServedRecord) for r in records)
    write_records(tmp_path / "serve.jsonl", records)
    assert (tmp_path / "serve.jsonl").read_bytes() == path.read_bytes()


def test_served_records_with_slots_target_and_a_refusal_write_and_read_back(tmp_path):
    answered = RequestTiming(0, 0.0, 0.4, 1.2, 7, chunk_gaps=[0.1, 0.2], text="x = 1", finish_reason="stop")
    refused = RequestTiming(1, 0.1, None, 0.01, 0, error="APIStatusError: Error code: 429", status=429)
    records = [ServedRecord(mode="spec-auto", family="spec-auto", k="auto", target="bf16", task="explain",
                            setting="sample", prompt_id=f"HumanEval/{t.index}", clients=8, slots=4, wall_seconds=9.5,
                            timing=t) for t in (answered, refused)]
    write_records(tmp_path / "serve.jsonl", records)
    assert read_served_records(tmp_path / "serve.jsonl") == records
    rows = [json.loads(line) for line in (tmp_path / "serve.jsonl").read_text().splitlines()]
    assert list(rows[0])[:10] == ["mode", "family", "k", "target", "task", "setting", "prompt_id", "clients", "slots",
                                  "wall_seconds"]
    assert "status" not in rows[0] and rows[1]["status"] == 429 and list(rows[1])[-1] == "status"
    write_records(tmp_path / "again.jsonl", read_served_records(tmp_path / "serve.jsonl"))
    assert (tmp_path / "again.jsonl").read_bytes() == (tmp_path / "serve.jsonl").read_bytes()


def test_optional_fields_are_written_only_when_set():
    plain = record().to_json()
    assert list(plain)[-1] == "text" and "valid" not in plain and plain["k"] is None  # k is always written
    parity = record(phase="parity", passed=False, outcome="failed: AssertionError", target="bf16").to_json()
    assert list(parity)[-4:] == ["text", "passed", "outcome", "target"] and parity["passed"] is False
    assert Record.from_json(parity) == record(phase="parity", passed=False, outcome="failed: AssertionError",
                                              target="bf16")
