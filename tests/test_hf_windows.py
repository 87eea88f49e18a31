"""The transformers backend on models whose cache is not a plain growing KV cache:
sliding-window layers (rollback must work) and linear-attention layers (rollback is
refused with a clear error; autoregressive generation still works)."""

import copy

import pytest
import torch

from specsample.backends.hf import HFBackend, RollbackUnsupported
from specsample.decoding.drafters import ModelDrafter
from specsample.decoding.generate import GenerationConfig, generate
from specsample.decoding.sampling import SamplingConfig

from tiny_hf import VOCAB, WINDOW, WINDOWED, tiny_recurrent_model, tiny_windowed_model

pytestmark = pytest.mark.pure

GREEDY = SamplingConfig(temperature=0)
SEQUENCE = torch.randint(0, VOCAB, (24,), generator=torch.Generator().manual_seed(0)).tolist()


def near_copy(model, scale=0.1):
    """The same model with its weights nudged: a draft that agrees often, not always."""
    draft = copy.deepcopy(model)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale * p.abs().mean())
    return draft


@pytest.fixture(scope="module", params=WINDOWED)
def windowed(request):
    return request.param, tiny_windowed_model(request.param, seed=0)


def test_the_window_is_applied(windowed):
    arch, model = windowed
    unwindowed = tiny_windowed_model(arch, seed=0, window=512)
    unwindowed.load_state_dict(model.state_dict())
    with_window = HFBackend(model).score(SEQUENCE, len(SEQUENCE))
    without = HFBackend(unwindowed).score(SEQUENCE, len(SEQUENCE))
    assert torch.allclose(with_window[:WINDOW], without[:WINDOW], atol=1e-5)
    assert not torch.allclose(with_window[WINDOW:], without[WINDOW:], atol=1e-3)


def test_score_rollback_score_equals_fresh_scoring(windowed):
    _, model = windowed
    fresh = HFBackend(model).score(SEQUENCE, len(SEQUENCE))  # [24, vocab]
    b = HFBackend(model)
    b.score(SEQUENCE[:3], 1)
    for i in range(3, len(SEQUENCE)):
        row = b.score([SEQUENCE[i]], 1)
        assert torch.allclose(row[0], fresh[i], atol=1e-4)
        if i % 3 == 0:  # drafts that get thrown away, past the window
            b.score([1, 2, 3, 4, 5, 6], 6)
            b.rollback(i + 1)
    b.rollback(5)  # far behind every state a windowed cache would still hold
    assert torch.allclose(b.score(SEQUENCE[5:12], 7), fresh[5:12], atol=1e-4)


@pytest.mark.parametrize("k", [2, 4])
def test_greedy_speculative_equals_greedy_autoregressive(windowed, k):
    _, model = windowed
    target = HFBackend(model)
    config = GenerationConfig(max_new_tokens=20, sampling=GREEDY)
    reference = generate(target, SEQUENCE[:6], config).token_ids
    drafter = ModelDrafter(HFBackend(near_copy(model)), GREEDY)
    result = generate(target, SEQUENCE[:6], config, drafter, k)
    assert result.token_ids == reference
    # Rejections and partial accepts both happened, so rollbacks reached back into drafts.
    assert 0 < result.stats.accepted < result.stats.drafted


def test_linear_attention_generates_but_refuses_rollback():
    b = HFBackend(tiny_recurrent_model(0), name="tiny-qwen3-next")
    result = generate(b, SEQUENCE[:6], GenerationConfig(max_new_tokens=5, sampling=GREEDY))
    assert len(result.token_ids) == 5
    b.score([1, 2], 2)
    with pytest.raises(RollbackUnsupported, match="tiny-qwen3-next keeps a recurrent state"):
        b.rollback(b.length - 1)
