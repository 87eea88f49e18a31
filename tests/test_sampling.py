import pytest
import torch

from specsample.sampling import MIN_TEMPERATURE, SamplingConfig, logits_to_probs, sample


def test_temperature_one_is_softmax():
    logits = torch.tensor([[1.0, 2.0, 3.0]])
    assert torch.allclose(logits_to_probs(logits, SamplingConfig()), torch.softmax(logits, -1))


def test_temperature_scales_logits():
    logits = torch.tensor([[1.0, 2.0, 3.0]])
    probs = logits_to_probs(logits, SamplingConfig(temperature=0.5))
    assert torch.allclose(probs, torch.softmax(logits / 0.5, -1))


def test_greedy_is_one_hot_at_argmax_lowest_id_on_ties():
    logits = torch.tensor([[0.0, 5.0, 5.0, 1.0], [9.0, 0.0, 0.0, 0.0]], dtype=torch.bfloat16)
    probs = logits_to_probs(logits, SamplingConfig(temperature=0))
    assert probs.dtype == torch.float32
    assert probs.tolist() == [[0, 1, 0, 0], [1, 0, 0, 0]]


@pytest.mark.parametrize("temperature", [1e-40, 1e-6])
def test_temperature_below_the_floor_is_greedy_not_nan(temperature):
    logits = torch.tensor([[0.0, 5.0, 5.0, 1.0], [-3.0, 2.0, 1.999, 0.0]])
    config = SamplingConfig(temperature=temperature)
    assert config.greedy
    assert logits_to_probs(logits, config).tolist() == [[0, 1, 0, 0], [0, 1, 0, 0]]


def test_temperature_at_the_floor_still_samples():
    config = SamplingConfig(temperature=MIN_TEMPERATURE)
    assert not config.greedy
    probs = logits_to_probs(torch.tensor([[0.0, 1e-4, 1e-4 + 1e-5]]), config)
    assert torch.isfinite(probs).all() and 0 < probs[0, 1] < probs[0, 2]


def test_top_k_keeps_k_largest_and_renormalises():
    logits = torch.log(torch.tensor([[0.1, 0.4, 0.2, 0.3]]))
    probs = logits_to_probs(logits, SamplingConfig(top_k=2))
    assert torch.allclose(probs, torch.tensor([[0.0, 4 / 7, 0.0, 3 / 7]]))


def test_top_p_keeps_token_that_crosses_threshold():
    logits = torch.log(torch.tensor([[0.1, 0.4, 0.2, 0.3]]))
    # sorted: .4, .3, .2, .1 -> mass before each: 0, .4, .7, .9; top_p=.6 keeps .4 and .3
    probs = logits_to_probs(logits, SamplingConfig(top_p=0.6))
    assert torch.allclose(probs, torch.tensor([[0.0, 4 / 7, 0.0, 3 / 7]]))
    # top_p=.7 exactly: .4+.3 reaches it, the .2 token is not needed
    probs = logits_to_probs(logits, SamplingConfig(top_p=0.7 + 1e-6))
    assert torch.allclose(probs, torch.tensor([[0.0, 0.4, 0.2, 0.3]]) / 0.9)


def test_top_k_then_top_p_then_temperature_together():
    logits = torch.log(torch.tensor([[0.1, 0.4, 0.2, 0.3]]))
    probs = logits_to_probs(logits, SamplingConfig(temperature=1.0, top_k=3, top_p=0.5))
    # top-3 renormalised: .4/.9, .3/.9, .2/.9 = .444, .333, .222; top-p .5 keeps .444 and .333
    assert torch.allclose(probs, torch.tensor([[0.0, 4 / 7, 0.0, 3 / 7]]))


@pytest.mark.parametrize("kwargs", [dict(temperature=-0.1), dict(top_k=-1), dict(top_p=0.0), dict(top_p=1.5)])
def test_invalid_controls_are_refused(kwargs):
    with pytest.raises(ValueError):
        SamplingConfig(**kwargs)


def test_sample_is_reproducible_with_a_generator():
    probs = torch.full((5, 10), 0.1)
    a = sample(probs, torch.Generator().manual_seed(3))
    b = sample(probs, torch.Generator().manual_seed(3))
    assert a.tolist() == b.tolist()
