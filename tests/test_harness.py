"""lm-evaluation-harness itself against the toy server (skipped when the `eval` extra
is not installed): both its clients complete the shipped tasks with no request error,
the scores are identical between an autoregressive and a speculative server, and the
harness's log-likelihoods equal the library's prompt scoring of the same tokens."""

import pytest

from benchmarks.studies.harness import GEN_TASK, MC_TASK, compare, evaluate, loglikelihoods

from serve_helpers import running, toy_app, toy_pair

pytest.importorskip("lm_eval")
pytest.importorskip("tenacity")  # the harness's API models need it

pytestmark = [pytest.mark.harness, pytest.mark.system]


def test_the_harness_scores_alike_autoregressive_and_speculative():
    runs = {}
    for drafter in ("none", "model"):
        app, _ = toy_app(drafter=drafter, policy=3, max_queue=64)
        with running(app) as url:
            runs[drafter] = evaluate(url, "toy", batch_size=2)
            runs[f"{drafter}-chat"] = evaluate(url, "toy", chat=True)
    for run in runs.values():
        assert GEN_TASK in run["scores"]
    assert len(runs["none"]["samples"][MC_TASK]) == 16 and len(loglikelihoods(runs["none"])) == 64
    report = compare({"none": runs["none"], "model": runs["model"]}, toy_pair()[0])
    assert report["scores_identical"], report["scores"]
    assert report["largest_loglikelihood_difference_between_runs"] == 0.0
    assert report["largest_difference_from_library"] < 1e-5
    assert compare({"none": runs["none-chat"], "model": runs["model-chat"]})["scores_identical"]
    generated = [s["resps"] for s in runs["model"]["samples"][GEN_TASK]]
    assert generated == [s["resps"] for s in runs["none"]["samples"][GEN_TASK]]
