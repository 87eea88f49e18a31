"""Assembly: options in, target, drafter and policy out, for every caller alike."""

import json

import pytest

from specsample.assemble import ModelOptions, Models, OptionError, assemble, make_drafter
from specsample.control import AdaptiveController, FixedK
from specsample.drafters import HybridDrafter, ModelDrafter, NgramDrafter
from specsample.sampling import SamplingConfig

from test_cli import WORDS, save_tiny
from toy import TrigramBackend, random_table

SAMPLING = SamplingConfig(temperature=0.7, top_p=0.9)


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    words = ["[UNK]", "[EOS]"] + WORDS + [f"w{i}" for i in range(90 - 2 - len(WORDS))]
    return save_tiny(tmp_path_factory.mktemp("assemble") / "target", 0, words)


def test_make_drafter_builds_each_kind_with_the_given_sampling():
    draft = TrigramBackend(random_table(4, 0), name="d")
    model = make_drafter(draft, SAMPLING, lookup=False)
    assert type(model) is ModelDrafter and model.sampling == SAMPLING and model.backend is draft
    hybrid = make_drafter(draft, SAMPLING, lookup=True, ngram_max=2)
    assert type(hybrid) is HybridDrafter and hybrid.model.sampling == SAMPLING and hybrid.ngram.max_ngram == 2
    assert type(make_drafter(None, SAMPLING, lookup=True)) is NgramDrafter
    assert make_drafter(None, SAMPLING, lookup=False) is None


def test_each_call_gets_a_fresh_drafter_for_its_own_sampling():
    """A server builds one per request: a ModelDrafter must draw from that request's
    distribution, and two requests must not share a drafter's cache bookkeeping."""
    models = Models(TrigramBackend(random_table(4, 0)), TrigramBackend(random_table(4, 1), name="d"), lookup=True)
    a, b = models.drafter(SAMPLING), models.drafter(SamplingConfig(temperature=0))
    assert a is not b and a.model.sampling == SAMPLING and b.model.sampling.greedy
    assert models.drafter_name == a.name


def test_the_adaptive_policy_only_for_auto_with_a_drafter(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECSAMPLE_CACHE", str(tmp_path))
    target, draft = TrigramBackend(random_table(4, 0)), TrigramBackend(random_table(4, 1))
    target.cost_key, draft.cost_key = "t", "d"
    policy = Models(target, draft).policy("auto", k_max=5)
    assert isinstance(policy, AdaptiveController) and policy.k_max == 5
    assert policy.costs.warm_started  # timed where the models are put together, not by the first request
    [cache] = (tmp_path / "costs").iterdir()
    assert cache.name.endswith("__t__d.json") and len(json.loads(cache.read_text())["target"]) == 6
    assert target.length == draft.length == 0  # the timing left the caches as they were
    fixed = Models(target, draft).policy(3)
    assert isinstance(fixed, FixedK) and fixed.k_max == 3
    nothing_drafts = Models(target).policy("auto")
    assert isinstance(nothing_drafts, FixedK) and len(list((tmp_path / "costs").iterdir())) == 1  # nothing timed


def test_assemble_ngram_autoregressive_and_refusals(tiny_target):
    models = assemble(ModelOptions(target=tiny_target, draft="ngram", lookup=False, ngram_max=2))
    assert models.draft is None and models.lookup  # "ngram" means lookup alone, whatever --lookup says
    assert isinstance(models.drafter(SAMPLING), NgramDrafter)
    assert not assemble(ModelOptions(target=tiny_target), drafting=False).drafts
    with pytest.raises(OptionError, match="--threads must be >= 1"):
        assemble(ModelOptions(target=tiny_target, threads=0))
    with pytest.raises(OptionError, match="needs the hf backend"):
        assemble(ModelOptions(target=tiny_target, draft=tiny_target, draft_backend="llamacpp", draft_vocab=10))
