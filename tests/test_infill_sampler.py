"""llama.cpp's infill sampler (infill_sampler.py): the tokens it keeps agree with a
line-by-line reading of llama.cpp's loop on random candidate sets, and speculative
sampling stays exact under it: the output follows the target's distribution after
top_k and the filter (chi-square, as test_sampling_controls.py), while a drafter that
filters and a target that does not must fail the same check."""

import random

import pytest
import torch

from specsample.decoding.drafters import ModelDrafter
from specsample.decoding.generate import GenerationConfig
from specsample.decoding.sampling import InvalidSetting, SamplingConfig, logits_to_probs
from specsample.output.infill_sampler import InfillStep, InfillVocab, infill_filter, infill_keep

from toy import ALPHA, TrigramBackend, assert_fits, assert_misfits, empirical, exact_distribution, random_table

pytestmark = pytest.mark.pure


def llama_cpp_infill(ids, probs, pieces, eog, eot):
    """llama_sampler_infill_apply as llama.cpp writes it (its loops, its order), on
    candidates already in descending order: the ids it leaves that can be drawn."""
    p, logit = list(probs), [0.0] * len(ids)  # logit -inf marks a removed token
    p_eog = sum(p[i] for i in range(len(ids)) if ids[i] in eog)
    p_txt = sum(p[i] for i in range(len(ids)) if ids[i] not in eog)
    if 3 * p_eog * len(ids) > p_txt:
        return [t for t in ids if t in eog]
    for i0 in range(len(ids)):
        for i1 in range(len(ids)):
            if logit[i0] == float("-inf"):
                break
            if i0 == i1 or logit[i1] == float("-inf"):
                continue
            a, b = pieces[ids[i0]], pieces[ids[i1]]
            if len(a) > 0 and len(a) <= len(b) and b[:len(a)] == a:
                dst, src = (i1, i0) if p[i1] > p[i0] else (i0, i1)
                p[dst] += p[src]
                logit[src], p[src] = float("-inf"), 0.0
    kept = [i for i in range(len(ids)) if p[i] >= 0.2 or ids[i] in eog]
    n_non_eog = sum(ids[i] not in eog for i in kept)
    if n_non_eog == 0:
        return [eot]
    total = sum(p[i] for i in kept)
    kept = [i for i in kept if p[i] / total >= 1.0 / (n_non_eog + 1) or ids[i] in eog]
    return [ids[i] for i in kept if logit[i] != float("-inf")]  # a merged end token stays, at -inf: never drawn


ALPHABET = [b"a", b"b", b"ab", b"ba", b"abc", b"a", b"", b"b "]


def test_it_keeps_what_llama_cpps_loop_keeps_on_random_candidates():
    rng = random.Random(0)
    branches = set()
    for case in range(3000):
        vocab = 40
        pieces = [rng.choice(ALPHABET) + bytes([rng.randrange(97, 100)]) * rng.randrange(3) for _ in range(vocab)]
        eog = frozenset(rng.sample(range(vocab), rng.randrange(3)))
        ids = rng.sample(range(vocab), rng.randrange(1, 12))
        weights = sorted((rng.random() ** 3 for _ in ids), reverse=True)
        if case % 5 == 1:  # many tokens of about equal mass: none may reach the floor
            ids = rng.sample(range(vocab), rng.randrange(12, 30))
            weights = sorted((1 + 0.1 * rng.random() for _ in ids), reverse=True)
        if case % 3 == 0:  # little mass on the end tokens: the merging path
            weights = [w * (0.01 if t in eog else 1.0) for t, w in zip(ids, weights)]
            ids = [t for _, t in sorted(zip(weights, ids), key=lambda x: -x[0])]
            weights = sorted(weights, reverse=True)
        probs = [w / sum(weights) for w in weights]
        table = InfillVocab(pieces.__getitem__, eog, eot=vocab - 1)
        kept = infill_keep(ids, probs, table)
        assert kept == llama_cpp_infill(ids, probs, pieces, eog, vocab - 1), (ids, probs, pieces, eog)
        branches.add("eog" if kept and all(t in eog for t in kept) else "fallback" if kept == [vocab - 1] and
                     vocab - 1 not in ids else "text")
    assert branches == {"eog", "fallback", "text"}


def test_merged_tokens_go_to_the_likelier_and_only_the_kept_are_drawn():
    pieces = [b"re", b"return", b"ret", b"x", b"<end>"]
    table = InfillVocab(pieces.__getitem__, frozenset({4}), eot=4)
    # "re" is a prefix of "return" and "ret": both merge into the likelier, "return".
    assert infill_keep([1, 0, 2, 3], [0.3, 0.25, 0.25, 0.2], table) == [1]
    logits = torch.log(torch.tensor([[0.25, 0.3, 0.25, 0.2, 1e-9]]))
    probs = logits_to_probs(logits, SamplingConfig(top_k=4, order=("top_k", "infill"), extra_step=InfillStep(table)))
    assert probs[0].tolist() == [0.0, 1.0, 0.0, 0.0, 0.0]
    # Nothing above the floor but the end token: the end of text alone, even where the
    # samplers before it had removed it.
    flat = torch.zeros(1, 7).masked_fill(torch.arange(7) == 6, float("-inf"))  # six of 1/6 each
    filtered = infill_filter(flat, InfillVocab([b"a", b"b", b"c", b"d", b"e", b"f", b""].__getitem__,
                                               frozenset({6}), eot=6))
    assert torch.isfinite(filtered[0]).tolist() == [False] * 6 + [True]


def test_a_config_names_its_order_and_refuses_what_it_cannot_take():
    table = InfillVocab(lambda t: b"x", frozenset(), eot=0)
    with pytest.raises(InvalidSetting, match="leaves out temperature"):
        SamplingConfig(temperature=0.5, order=("top_k",))
    with pytest.raises(InvalidSetting, match="top_k of 1 to"):
        SamplingConfig(order=("infill",), extra_step=InfillStep(table))
    with pytest.raises(InvalidSetting, match="at most once"):
        SamplingConfig(order=("top_k", "top_k"))
    with pytest.raises(InvalidSetting, match="at most once"):  # the core has no infill step of its own
        SamplingConfig(top_k=3, order=("top_k", "infill"))
    with pytest.raises(ValueError, match="not in the order"):
        SamplingConfig(top_k=3, order=("top_k",), extra_step=InfillStep(table))
    logits = torch.randn(4, 30)
    for plain in (SamplingConfig(0.7, 5, 0.9, 0.05), SamplingConfig(0.0, 3)):  # the default order, named
        named = SamplingConfig(plain.temperature, plain.top_k, plain.top_p, plain.min_p,
                               order=("temperature", "min_p", "top_k", "top_p"))
        assert torch.allclose(logits_to_probs(logits, plain), logits_to_probs(logits, named), atol=1e-6)


VOCAB, LENGTH, N = 6, 3, 3_000  # 12 sequences, the least likely ~100 times
CONTROL_N = 375  # the negative control: an eighth of N
PROMPT = [1, 2]
TARGET, FAR = random_table(VOCAB, seed=0), random_table(VOCAB, seed=2)
# "a" is a prefix of "ab"; no end token (its branch collapses this table to two sequences:
# the comparison with llama.cpp's loop above covers it).
PIECES = [b"a", b"ab", b"c", b"d", b"e", b""]
FILTER = InfillVocab(PIECES.__getitem__, frozenset(), eot=5)
INFILL = SamplingConfig(top_k=4, order=("top_k", "infill"), extra_step=InfillStep(FILTER), logit_bias={5: -2.0})


def speculative(target_sampling, draft_sampling, n=N):
    """n outputs of the target under `target_sampling`, drafted under `draft_sampling`."""
    config = GenerationConfig(max_new_tokens=LENGTH, sampling=target_sampling, verifier="rejection")
    drafter = ModelDrafter(TrigramBackend(FAR, name="draft"), draft_sampling)
    return empirical(n, TrigramBackend(TARGET), PROMPT, config, drafter, 3)


def test_speculative_sampling_under_the_infill_sampler_is_exact():
    exact = exact_distribution(TrigramBackend(TARGET), PROMPT, LENGTH, INFILL)
    assert 8 <= len(exact) < VOCAB ** LENGTH  # the filter removed sequences, and left several
    assert_fits(speculative(INFILL, INFILL), exact, N)


def test_negative_control_a_drafter_that_filters_and_a_target_that_does_not_fails():
    """At CONTROL_N = 375, an eighth of N: p = 0, as at N (the unfiltered target emits
    sequences the filter removed, outside the exact support). A test's power grows
    with its sample, so what fails at 375 fails at 3,000."""
    plain = SamplingConfig(top_k=4, logit_bias={5: -2.0})
    exact = exact_distribution(TrigramBackend(TARGET), PROMPT, LENGTH, INFILL)
    p = assert_misfits(speculative(plain, INFILL, n=CONTROL_N), exact, CONTROL_N)
    assert p < 1e-3 * ALPHA  # far below the level, so no seed change makes it pass by chance
