"""Where a load's time went in our server (benchmarks/calls.py): the /metrics page the
server really writes, read before and after a load, as calls by model and by requests
served, and the wall time split into calls, own work and idle."""

import pytest
from prometheus_client import generate_latest

from benchmarks.calls import CallSplit, scrape, split_table
from specsample.serve.metrics import Metrics

pytestmark = pytest.mark.pure


class FakeWorker:
    active, depth, parallel, busy_seconds = 0, 0, 4, 0.0
    prompt_cache = None  # a worker without host memory for its slots' texts (--prompt-cache-mib 0)


def page(metrics) -> str:
    return generate_latest(metrics.registry).decode()


def test_a_load_is_the_difference_of_the_pages_around_it():
    metrics, worker = Metrics(), FakeWorker()
    metrics.watch(worker)
    metrics.call(True, 1, 1, 0.5)  # before the load: a warm-up call
    worker.busy_seconds = 1.0
    before = page(metrics)
    for _ in range(3):  # the load: 3 target calls serving 4 requests, 1 serving 2, draft steps
        metrics.call(True, 4, 10, 0.2)
    metrics.call(True, 2, 3, 0.1)
    metrics.call(False, 4, 4, 0.05)
    metrics.call(False, 4, 4, 0.05)
    metrics.call(True, 2, 130, 0.4, prompt=True)  # a newcomer's prompt chunk beside a round
    metrics.call(False, 1, 40, 0.1, prompt=True)  # the draft catching up on it
    worker.busy_seconds = 3.0
    split = CallSplit.between(before, page(metrics), mode="spec-auto", task="humaneval", setting="greedy", slots=4,
                              clients=4, wall_seconds=2.0)
    assert split.calls["target"] == {4: pytest.approx([3, 30, 0.6]), 2: pytest.approx([1, 3, 0.1])}
    assert split.calls["draft"] == {4: pytest.approx([2, 8, 0.1])}
    assert 1 not in split.calls["target"]  # the warm-up was before the load
    assert split.prompt_calls == {"target": pytest.approx([1, 130, 0.4]), "draft": pytest.approx([1, 40, 0.1])}
    assert split.busy_seconds == pytest.approx(2.0)
    assert split.seconds("target") == pytest.approx(0.7) and split.own_work_seconds == pytest.approx(0.7)
    table = split_table([split])
    assert "2: 1 (3.0, 100); 4: 3 (10.0, 200)" in table  # the prompt chunk is not averaged in
    assert "| 1 (130.0, 400); 1 (40.0, 100) |" in table
    # wall, prompt, target, draft, own, idle
    assert table.splitlines()[-1].endswith("| 2.0 | 0.5 | 0.7 | 0.1 | 0.7 | 0.0 |")
    assert CallSplit.from_json(split.to_json()) == split


def test_a_page_without_the_counters_reads_as_nothing():
    assert scrape("# HELP other\nother_total 3.0\n") == ({}, 0.0)


def test_a_page_from_before_the_phase_label_reads_as_the_rounds_calls():
    page = ('specsample_model_calls_total{model="target",sequences="2"} 3.0\n'
            'specsample_model_call_seconds_total{model="target",sequences="2"} 0.6\n')
    assert scrape(page) == ({("target", 2, "decode"): [3.0, 0.0, 0.6]}, 0.0)
