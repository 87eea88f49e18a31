import pytest
import torch

from specsample.decoding.sampling import (MIN_TEMPERATURE, InvalidSetting, SamplingConfig, _top_p_filter, bias_entry,
                                          logits_to_probs, sample)

pytestmark = pytest.mark.pure


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


# --- min_p, logit_bias and the penalties --------------------------------------

from specsample.decoding.sampling import History, Sampler, coupled_choice, process_logits, race_noise  # noqa: E402


def test_min_p_keeps_tokens_within_a_factor_of_the_top_one():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    # min_p .2: the floor is .1, so .05 goes and the rest are renormalised
    probs = logits_to_probs(logits, SamplingConfig(min_p=0.2))
    assert torch.allclose(probs, torch.tensor([[0.5, 0.3, 0.15, 0.0]]) / 0.95)
    # after temperature: at T = 2 the ratios are square roots, .05 -> sqrt(.1) = .32 of the top
    probs = logits_to_probs(logits, SamplingConfig(temperature=2.0, min_p=0.3))
    assert probs[0, 3] > 0 and probs[0, 2] > 0


def test_logit_bias_moves_greedy_and_sampling_and_refuses_ids_past_the_vocabulary():
    logits = torch.tensor([[2.0, 1.0, 0.0]])
    greedy = SamplingConfig(temperature=0, logit_bias={1: 1.5})
    assert greedy.logit_bias == ((1, 1.5),)
    assert logits_to_probs(logits, greedy).tolist() == [[0, 1, 0]]
    probs = logits_to_probs(logits, SamplingConfig(logit_bias={2: -100}))
    assert probs[0, 2] < 1e-40 and torch.allclose(probs[0, :2], torch.softmax(logits[0, :2], -1))
    past = SamplingConfig(logit_bias={1: 1.5, 99: 100.0})  # the config cannot know the vocabulary
    with pytest.raises(ValueError, match=r"token ids in \[0, 3\)"):  # a bias that would do nothing
        logits_to_probs(logits, past)
    with pytest.raises(ValueError, match=r"token ids in \[0, 99\)"):
        past.check_vocabulary(99)
    past.check_vocabulary(100)


def test_penalties_count_generated_tokens_and_the_repetition_penalty_the_prompt_too():
    logits = torch.tensor([[2.0, -1.0, 3.0, 1.0, 0.5]])
    # prompt [0, 1]; generated [2, 2, 3]
    history = History([0, 1, 2, 2, 3], prompt_length=2)
    config = SamplingConfig(presence_penalty=0.5, frequency_penalty=0.25, repetition_penalty=2.0)
    out = process_logits(logits, config, history)
    expected = [2.0 / 2,  # prompt: repetition only
                -1.0 * 2,  # prompt, negative logit: multiplied
                3.0 / 2 - 0.5 - 2 * 0.25,  # generated twice
                1.0 / 2 - 0.5 - 0.25,  # generated once
                0.5]  # never seen
    assert torch.allclose(out, torch.tensor([expected]))


def test_each_row_of_a_block_counts_the_tokens_before_it():
    logits = torch.zeros(3, 4)
    # prompt [3]; then generated 0 before the block; the block's rows follow [3, 0], [3, 0, 1], [3, 0, 1, 1]
    out = process_logits(logits, SamplingConfig(frequency_penalty=1.0), History([3, 0, 1, 1], prompt_length=1))
    assert out.tolist() == [[-1, 0, 0, 0], [-1, -1, 0, 0], [-1, -2, 0, 0]]
    with pytest.raises(ValueError, match="inside the prompt"):
        process_logits(torch.zeros(5, 4), SamplingConfig(frequency_penalty=1.0), History([3, 0, 1, 1], 1))
    with pytest.raises(ValueError, match="History"):
        process_logits(logits, SamplingConfig(presence_penalty=1.0))


@pytest.mark.parametrize("kwargs", [dict(min_p=-0.1), dict(min_p=1.5), dict(presence_penalty=2.5),
                                    dict(frequency_penalty=-3), dict(repetition_penalty=0),
                                    dict(repetition_penalty=float("nan")), dict(logit_bias={1: 101}),
                                    dict(logit_bias={-1: 1})])
def test_invalid_new_controls_are_refused(kwargs):
    with pytest.raises(ValueError):
        SamplingConfig(**kwargs)


INF, NAN = float("inf"), float("nan")


@pytest.mark.parametrize("kwargs", [dict(temperature=INF), dict(temperature=NAN), dict(top_p=NAN), dict(min_p=NAN),
                                    dict(presence_penalty=NAN), dict(frequency_penalty=-INF),
                                    dict(repetition_penalty=INF), dict(logit_bias={1: NAN}),
                                    dict(logit_bias={1: INF}), dict(top_k=1 << 31)])
def test_non_finite_and_unbounded_controls_are_refused(kwargs):
    with pytest.raises(InvalidSetting) as refused:
        SamplingConfig(**kwargs)
    assert refused.value.field == next(iter(kwargs))


def test_a_refusal_names_its_field_in_each_callers_spelling():
    with pytest.raises(InvalidSetting) as refused:
        SamplingConfig(top_p=1.5)
    assert str(refused.value) == "top-p must be in (0, 1], got 1.5"  # the CLI's
    assert refused.value.message("top_p") == "top_p must be in (0, 1], got 1.5"  # the server's


@pytest.mark.parametrize("token", ["\u0663", "\u00b2", "3.0", "-1", " 3", "", True, 1.0])
def test_logit_bias_ids_are_ascii_digits_or_ints_only(token):
    """str.isdigit takes an Arabic-Indic 3 (which int() reads as 3) and a superscript 2
    (which int() refuses): ids are ASCII digits, as OpenAI's JSON keys are."""
    with pytest.raises(InvalidSetting, match="token ids in"):
        bias_entry(token, 1.0, vocab_size=10)


def test_logit_bias_ids_as_strings_of_ascii_digits_are_read():
    assert bias_entry("3", 2, vocab_size=10) == (3, 2.0)
    assert SamplingConfig(logit_bias={"7": -1.0}).logit_bias == ((7, -1.0),)


# --- coupled draws --------------------------------------------------------------

def test_race_noise_is_a_function_of_seed_and_position_alone():
    assert torch.equal(race_noise(7, 12, 50), race_noise(7, 12, 50))
    assert not torch.equal(race_noise(7, 12, 50), race_noise(7, 13, 50))
    assert not torch.equal(race_noise(7, 12, 50), race_noise(8, 12, 50))
    sampler = Sampler(coupled_seed=7)
    assert torch.equal(sampler.noise(11, 3, 50)[1], race_noise(7, 12, 50))


def test_coupled_choice_follows_the_distribution_and_never_picks_zero_mass():
    probs = torch.tensor([[0.2, 0.5, 0.0, 0.3]])
    counts = torch.zeros(4)
    for position in range(20_000):
        counts[coupled_choice(probs, race_noise(1, position, 4)[None])] += 1
    assert counts[2] == 0
    # binomial sd <= sqrt(.25 / 20000) = .0035; allow 5 sd: the three frequencies are
    # 5.1, 5.6 and 6.3 of their own sd away from failing, a false alarm at most 4e-7
    from toy import counted

    counted(4e-7)
    assert torch.allclose(counts / 20_000, probs[0], atol=0.018)
def full_sort_top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """The definition, without the top-256 shortcut: sort everything, keep the prefix
    whose mass before each token is below top_p. probs [n, vocab]."""
    ordered, index = probs.sort(dim=-1, descending=True)
    kept = ordered.masked_fill(ordered.cumsum(-1) - ordered >= top_p, 0.0)
    filtered = torch.zeros_like(probs).scatter_(-1, index, kept)
    return filtered / filtered.sum(-1, keepdim=True)


@pytest.mark.parametrize("vocab,scale,top_p", [
    (12_000, 0.5, 0.9),  # flat: widens 256 -> 2048 -> the whole vocabulary
    (50_000, 1.5, 0.95),  # a longer tail: stops at an intermediate width
    (152_000, 2.0, 0.8),  # Qwen's width
])
def test_top_p_past_the_first_256_tokens_matches_a_full_sort(vocab, scale, top_p):
    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(3, vocab, generator=g) * scale
    logits[0, :10] += 30.0  # one row is satisfied within 256 tokens while the others widen
    probs = torch.softmax(logits, dim=-1)
    expected = full_sort_top_p(probs, top_p)
    got = _top_p_filter(probs, top_p)
    kept = (expected > 0).sum(-1)
    assert kept[0] <= 10 and (kept[1:] > 256).all()  # the widening branch decides rows 1 and 2
    # The same tokens, bar at most one at the threshold, where float32 sums in another order may differ.
    assert ((got > 0) != (expected > 0)).sum(-1).max() <= 1
    assert torch.allclose(got, expected, atol=1e-6)


def test_sample_at_a_large_vocabulary_follows_the_distribution():
    """Inverse-CDF sampling over 20,000 tokens with the mass spread over thousands of
    them (a float64 running sum and a binary search). A per-token chi-square has
    ~10,000 degrees of freedom here and little power, so tokens are grouped by
    probability rank into 100 bins of 1% mass each: 20,000 draws must fit them
    (toy.ALPHA), and a sampler that drops the least likely 1% of the mass (an expected
    chi-square of ~300 on 99 degrees of freedom, p ~ 1e-20), or that is off by one
    token, must not."""
    from toy import assert_fits, assert_misfits

    vocab, n, bins = 20_000, 20_000, 100
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(vocab, generator=g) * 1.5, dim=-1)  # [vocab]
    ordered, by_rank = probs.sort()
    bin_of = torch.empty(vocab, dtype=torch.long)  # [vocab] token -> its bin
    bin_of[by_rank] = ((ordered.double().cumsum(0) - ordered) * bins).long().clamp_max(bins - 1)
    exact = {(b,): float(m) for b, m in enumerate(torch.zeros(bins).index_add_(0, bin_of, probs))}

    def draws(row: torch.Tensor) -> torch.Tensor:  # [n]
        return torch.cat([sample(row.expand(500, vocab), g) for _ in range(n // 500)])

    def binned(tokens: torch.Tensor) -> dict:
        return {(b,): c for b, c in enumerate(torch.bincount(bin_of[tokens], minlength=bins).tolist())}

    right = draws(probs)
    assert_fits(binned(right), exact, n)
    truncated = probs.clone()
    truncated[by_rank[ordered.cumsum(0) < 0.01]] = 0.0
    assert_misfits(binned(draws(truncated / truncated.sum())), exact, n)
    # Off by one: the same draws, each moved to the next token (a third sampling pass
    # over 20,000 x 20,000 would cost a third of this test for the same distribution).
    assert_misfits(binned((right + 1) % vocab), exact, n)

