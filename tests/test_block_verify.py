"""Block verification (decoding/verify.py: verify_block, block_acceptance; Sun et al.,
ICLR 2025): the output is still the target's, and it keeps at least as many drafts as
token-by-token verification.

Exactness is checked three ways. By enumeration: over every draft chain of a toy pair
whose rows depend on the whole prefix (fixed K, or a length the drafted prefix
decides), the rule (block_acceptance and the weighted residual) gives the target's
joint distribution of the next K + 1 tokens to 1e-6; recovering from the token-by-token
residual instead misses it by over 1e-3. By sampling verify_block itself: a chain
drafted from the toy draft, verified, and continued by the target to K + 1 tokens,
SAMPLES times, fits that joint distribution (toy.assert_fits, Pearson chi-square,
p < toy.ALPHA = 1e-6 fails); a wrong acceptance rule, keeping each prefix with its own
weight, fails it already at a quarter of SAMPLES (CONTROL_SAMPLES = 1,500: p ~ 5e-23;
5e-116 at 6,000): a test's power grows with its sample, so it fails at SAMPLES too.
And through the loop (generate with verifier="block": a model drafter, the overlapped
path, a grammar), by the same token-by-token check as tests/test_distribution.py, which
the wrong rule fails too.
"""

import itertools
import math

import pytest
import torch

from specsample.decoding import rounds as rounds_module
from specsample.decoding import verify as verify_module
from specsample.decoding.drafters import NgramDrafter
from specsample.decoding.generate import GenerationConfig, generate
from specsample.decoding.sampling import SamplingConfig, sample
from specsample.decoding.verify import block_acceptance, residual_distribution, verify, verify_block

import test_constraints
import test_distribution
import test_overlap
from toy import ALPHA, TrigramBackend, assert_does_not_follow, assert_fits, assert_follows, assert_misfits, empirical

pytestmark = pytest.mark.pure

VOCAB = 3
SAMPLES = 6_000  # each sampled check of verify_block alone
CONTROL_SAMPLES = 1_500  # the wrong block rule's control


class PrefixPair:
    """A toy target and draft whose rows are random for every prefix (not only the last
    tokens): rows(prefix) -> (target [vocab], draft [vocab]), float32, fixed by the seed."""

    def __init__(self, seed: int, vocab: int = VOCAB, sharpness: float = 1.5, one_hot_draft: bool = False):
        self.seed, self.vocab, self.sharpness, self.one_hot_draft = seed, vocab, sharpness, one_hot_draft
        self._rows: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def rows(self, prefix: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        if prefix not in self._rows:
            g = torch.Generator().manual_seed(hash((self.seed,) + prefix) % (1 << 62))
            target = torch.softmax(torch.randn(self.vocab, generator=g) * self.sharpness, -1)
            draft = torch.softmax(torch.randn(self.vocab, generator=g) * self.sharpness, -1)
            if self.one_hot_draft:  # a lookup: the draft is certain of one token
                draft = torch.nn.functional.one_hot(draft.argmax(), self.vocab).float()
            self._rows[prefix] = (target, draft)
        return self._rows[prefix]

    def target(self, prefix: tuple) -> torch.Tensor:
        return self.rows(prefix)[0]

    def draft(self, prefix: tuple) -> torch.Tensor:
        return self.rows(prefix)[1]

    def block(self, chain: tuple) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """verify's arguments for a drafted chain: tokens [k], draft rows [k, vocab],
        target rows [k + 1, vocab]."""
        drafts = torch.stack([self.draft(chain[:i]) for i in range(len(chain))])
        targets = torch.stack([self.target(chain[:i]) for i in range(len(chain) + 1)])
        return torch.tensor(chain, dtype=torch.long), drafts, targets

    def chains(self, k: int):
        """Every chain of k drafts the draft can propose, with its probability."""
        for chain in itertools.product(range(self.vocab), repeat=k):
            p = math.prod(float(self.draft(chain[:i])[t]) for i, t in enumerate(chain))
            if p > 0:
                yield chain, p

    def joint(self, length: int) -> dict[tuple, float]:
        """The target's distribution of the next `length` tokens."""
        out = {}
        for seq in itertools.product(range(self.vocab), repeat=length):
            p = math.prod(float(self.target(seq[:i])[t]) for i, t in enumerate(seq))
            if p > 0:
                out[seq] = p
        return out


def kept_lengths(stops: torch.Tensor) -> list[float]:
    """P(the verdict keeps n drafts), n = 0..k, from block_acceptance's stops: prefix n
    is kept when its uniform falls under stops[n - 1] and no longer prefix's did."""
    stops = stops.double().tolist()
    k = len(stops)
    later = [math.prod(1 - s for s in stops[n:]) for n in range(k + 1)]  # no prefix longer than n kept
    return [later[0]] + [stops[n - 1] * later[n] for n in range(1, k + 1)]


def token_kept_lengths(tokens, drafts, targets) -> list[float]:
    """The same for token-by-token verification: each draft passes with min(1, target / draft)."""
    k = len(tokens)
    ratios = [min(1.0, float(targets[i, t]) / float(drafts[i, t])) for i, t in enumerate(tokens.tolist())]
    reach = [math.prod(ratios[:n]) for n in range(k + 1)]
    return [reach[n] - (reach[n + 1] if n < k else 0.0) for n in range(k + 1)]


def stopped_chains(pair: PrefixPair, k: int, prefix: tuple = (), p: float = 1.0):
    """Chains whose length the drafted prefix decides, as the planner's may: drafting
    stops after a 0 is drafted, or at k drafts."""
    if len(prefix) == k or prefix and prefix[-1] == 0:
        yield prefix, p
        return
    for token in range(pair.vocab):
        yield from stopped_chains(pair, k, prefix + (token,), p * float(pair.draft(prefix)[token]))


def exact_output(pair: PrefixPair, k: int, weighted_residual: bool = True, chains=None) -> dict[tuple, float]:
    """The distribution of the first k + 1 tokens when a chain of k drafts (or those
    `chains` gives) is verified by block_acceptance's rule and the rest comes from the
    target."""
    out: dict[tuple, float] = {}
    for chain, p_chain in chains or pair.chains(k):
        tokens, drafts, targets = pair.block(chain)
        weights, stops = block_acceptance(tokens, drafts, targets)
        for n, p_n in enumerate(kept_lengths(stops)):
            if p_n <= 0:
                continue
            if n == len(chain):
                after = targets[n].double()
            else:
                after = residual_distribution(targets[n], drafts[n], weights[n] if weighted_residual else 1.0).double()
            for token in range(pair.vocab):
                if after[token] <= 0:
                    continue
                start = chain[:n] + (token,)
                for rest, p_rest in continuation(pair, start, k + 1):
                    out[rest] = out.get(rest, 0.0) + p_chain * p_n * float(after[token]) * p_rest
    return out


def continuation(pair: PrefixPair, start: tuple, length: int):
    """Every way the target continues `start` to `length` tokens, with its probability."""
    for rest in itertools.product(range(pair.vocab), repeat=length - len(start)):
        seq = start + rest
        yield seq, math.prod(float(pair.target(seq[:i])[t]) for i, t in enumerate(seq) if i >= len(start))


# ---- the rule, exactly --------------------------------------------------------------


def test_the_papers_example_keeps_11_ninths_of_a_draft_against_10_ninths():
    """verify_block's worked example: the same rows at every position, target [1/3, 2/3],
    draft [2/3, 1/3], two drafts (the paper's Section 3 example)."""
    target, draft = torch.tensor([1 / 3, 2 / 3]), torch.tensor([2 / 3, 1 / 3])
    block_mean = token_mean = 0.0
    for chain in itertools.product(range(2), repeat=2):
        tokens, drafts, targets = torch.tensor(chain), draft.expand(2, 2), target.expand(3, 2)
        p_chain = math.prod(float(draft[t]) for t in chain)
        _, stops = block_acceptance(tokens, drafts, targets)
        block_mean += p_chain * sum(n * p for n, p in enumerate(kept_lengths(stops)))
        token_mean += p_chain * sum(n * p for n, p in enumerate(token_kept_lengths(tokens, drafts, targets)))
    assert block_mean == pytest.approx(11 / 9, abs=1e-6) and token_mean == pytest.approx(10 / 9, abs=1e-6)
    _, stops = block_acceptance(torch.tensor([0, 1]), draft.expand(2, 2), target.expand(3, 2))
    assert kept_lengths(stops)[2] == pytest.approx(1.0)  # [a, b] is wanted as often as drafted: kept always


@pytest.mark.parametrize("k", [1, 2, 3, 4])
@pytest.mark.parametrize("one_hot_draft", [False, True])
def test_the_rule_gives_the_targets_joint_distribution_by_enumeration(k, one_hot_draft):
    for seed in range(3):
        pair = PrefixPair(seed, one_hot_draft=one_hot_draft)
        exact, out = pair.joint(k + 1), exact_output(pair, k)
        assert set(out) <= set(exact)
        assert max(abs(out.get(seq, 0.0) - p) for seq, p in exact.items()) < 1e-6


@pytest.mark.parametrize("k", [2, 4])
def test_the_rule_stays_exact_when_the_drafted_prefix_decides_the_blocks_length(k):
    pair = PrefixPair(11)
    exact, out = pair.joint(k + 1), exact_output(pair, k, chains=stopped_chains(pair, k))
    assert max(abs(out.get(seq, 0.0) - p) for seq, p in exact.items()) < 1e-6


def test_negative_control_the_token_residual_after_a_kept_prefix_fails_the_enumeration():
    """Wrong: after a kept prefix, recover from norm(max(0, target - draft)) as token by
    token does, leaving out the prefix's weight. Only a prefix kept with a weight below
    1 recovers differently, which is rare (its stop is small), so the error is small:
    total variation 0.012 on this pair, the largest of 36 tried, too little for the
    sampled check at this N; the enumeration sees it 1000 times above its tolerance."""
    pair = PrefixPair(4, sharpness=0.5)
    exact, out = pair.joint(4), exact_output(pair, 3, weighted_residual=False)
    assert max(abs(out.get(seq, 0.0) - p) for seq, p in exact.items()) > 1e-3


@pytest.mark.parametrize("k", [1, 2, 3, 4, 6])
def test_block_verification_keeps_at_least_as_many_drafts_as_token_by_token(k):
    """Exact expected drafts kept, over every chain of random pairs (sharp and flat
    rows): never fewer than token by token's, and more on average. With one-hot drafts
    (a lookup) each prefix is kept exactly as often: nothing is over-drafted but the
    chain itself, so there is no mass to pay back."""
    gains = []
    for seed, sharpness in itertools.product(range(4), (0.5, 1.5, 3.0)):
        pair = PrefixPair(100 + seed, vocab=4 if k <= 4 else 2, sharpness=sharpness)
        block_mean = token_mean = 0.0
        for chain, p_chain in pair.chains(k):
            tokens, drafts, targets = pair.block(chain)
            _, stops = block_acceptance(tokens, drafts, targets)
            block_mean += p_chain * sum(n * p for n, p in enumerate(kept_lengths(stops)))
            token_mean += p_chain * sum(n * p for n, p in enumerate(token_kept_lengths(tokens, drafts, targets)))
        assert block_mean >= token_mean - 1e-6
        gains.append(block_mean - token_mean)
    assert k == 1 and max(gains) < 1e-6 or k > 1 and sum(gains) / len(gains) > 1e-3  # one draft: the same rule
    lookup = PrefixPair(7, vocab=4 if k <= 4 else 2, one_hot_draft=True)
    for chain, _ in lookup.chains(k):
        tokens, drafts, targets = lookup.block(chain)
        _, stops = block_acceptance(tokens, drafts, targets)
        assert kept_lengths(stops) == pytest.approx(token_kept_lengths(tokens, drafts, targets), abs=1e-6)


def test_greedy_rows_keep_the_same_drafts_and_token_as_token_by_token():
    """One-hot target and draft rows: block verification keeps exactly the drafts up to
    the first that is not the target's argmax, then the argmax, as verify does."""
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        k = int(torch.randint(1, 6, (), generator=g))
        argmax = torch.randint(0, 4, (k + 1,), generator=g)
        targets = torch.nn.functional.one_hot(argmax, 4).float()  # [k + 1, 4]
        tokens = torch.where(torch.rand(k, generator=g) < 0.7, argmax[:k], torch.randint(0, 4, (k,), generator=g))
        drafts = torch.nn.functional.one_hot(tokens, 4).float()  # [k, 4]
        assert verify_block(tokens, drafts, targets, g) == verify(tokens, drafts, targets, g)


# ---- verify_block sampled -----------------------------------------------------------


def sampled(pair: PrefixPair, k: int, n: int = SAMPLES, seed: int = 0, verifier=verify_block) -> dict[tuple, int]:
    """n times: draft k tokens, verify them, continue with the target to k + 1 tokens."""
    g = torch.Generator().manual_seed(seed)
    counts: dict[tuple, int] = {}
    for _ in range(n):
        chain = ()
        for _ in range(k):
            chain += (int(sample(pair.draft(chain)[None], g)),)
        tokens, drafts, targets = pair.block(chain)
        seq = tuple(verifier(tokens, drafts, targets, g).tokens)
        while len(seq) < k + 1:
            seq += (int(sample(pair.target(seq)[None], g)),)
        counts[seq] = counts.get(seq, 0) + 1
    return counts


@pytest.mark.parametrize("k", [2, 3, 4])
def test_verify_block_samples_follow_the_targets_joint_distribution(k):
    pair = PrefixPair(k)
    assert_fits(sampled(pair, k), pair.joint(k + 1), SAMPLES)


def each_prefix_with_its_weight(tokens, drafts, targets):
    """Wrong: keep prefix i with probability weights[i], scanning back from the whole
    block, as if the whole block's rule held for every prefix."""
    weights, _ = block_acceptance(tokens, drafts, targets)
    return weights, torch.tensor(weights[1:], dtype=torch.float32)


def test_negative_control_a_wrong_block_rule_fails_the_check(monkeypatch):
    monkeypatch.setattr(verify_module, "block_acceptance", each_prefix_with_its_weight)
    pair = PrefixPair(3)
    p = assert_misfits(sampled(pair, 3, n=CONTROL_SAMPLES), pair.joint(4), CONTROL_SAMPLES)
    assert p < 1e-3 * ALPHA  # far below the level, so no seed change makes it pass by chance


# ---- through the loop ---------------------------------------------------------------

TARGET, PROMPT = test_distribution.TARGET, test_distribution.PROMPT
LOOP_CONTROL_SAMPLES = 1_000  # the wrong rule through the loop (test_distribution.SAMPLES for the checks)


@pytest.mark.parametrize("k,temperature,top_p", [(4, 0.7, 0.9)])
def test_block_verified_generation_follows_the_target(monkeypatch, k, temperature, top_p):
    calls = []
    monkeypatch.setattr(rounds_module, "verify_block", lambda *a: calls.append(1) or verify_block(*a))
    sampling = SamplingConfig(temperature, 0, top_p)
    counts = test_distribution.fixed(test_distribution.model_drafter("far", sampling), sampling, k, verifier="block")
    assert calls  # the rounds were verified as blocks
    assert_follows(counts, TrigramBackend(TARGET), PROMPT, sampling)


def test_negative_control_a_wrong_block_rule_fails_the_loops_check(monkeypatch):
    """At LOOP_CONTROL_SAMPLES = 1,000, a quarter of the loop's check: p ~ 4e-15 (5e-82
    at its 4,000; 1e-6 at 500, too near the level). A test's power grows with its
    sample, so what fails at 1,000 fails at 4,000."""
    monkeypatch.setattr(verify_module, "block_acceptance", each_prefix_with_its_weight)
    sampling = SamplingConfig()
    counts = test_distribution.fixed(test_distribution.model_drafter("far", sampling), sampling, 3, verifier="block",
                                     n=LOOP_CONTROL_SAMPLES)
    p = assert_does_not_follow(counts, TrigramBackend(TARGET), PROMPT, sampling)
    assert p < 1e-3 * ALPHA  # far below the level, so no seed change makes it pass by chance


def test_lookup_drafts_stay_with_token_by_token_verification(monkeypatch):
    """One-hot drafts: the same law either way (see the enumeration above), so the
    cheaper rule runs."""
    monkeypatch.setattr(rounds_module, "verify_block", lambda *a: pytest.fail("verify_block on one-hot drafts"))
    sampling = SamplingConfig()
    counts = empirical(200, TrigramBackend(TARGET), PROMPT, GenerationConfig(max_new_tokens=test_distribution.LENGTH, sampling=sampling, verifier="block"),
                       NgramDrafter(max_ngram=2), 3)
    assert sum(counts.values()) == 200


def test_the_overlapped_path_with_block_verification_follows_the_target():
    """A block kept after a whole block was accepted replaces the bonus token: the bonus
    is drawn from the target's row after the block whatever the rule kept, so the next
    round may verify the kept block there instead."""
    sampling = SamplingConfig(0.9)
    counts, predrafted = test_overlap.overlapped("close", sampling, 3, verifier="block")
    assert predrafted > 0
    assert_follows(counts, TrigramBackend(test_overlap.TARGET), test_overlap.PROMPT, sampling)


def test_constrained_block_verification_follows_the_masked_target():
    """A grammar masks the target's and the draft's rows after their own prefixes: block
    verification is exact for any rows the drafts were drawn from and the target wants,
    so for the masked ones too; forced tokens are one-hot rows on both sides."""
    sampling = SamplingConfig(1.0)
    counts = test_constraints.constrained(test_constraints.model_drafter("far", sampling), sampling, 3, verifier="block")
    assert_fits(counts, test_constraints.exact(sampling), test_constraints.N)


def test_greedy_generation_is_the_same_under_either_verifier():
    greedy = SamplingConfig(temperature=0)
    runs = [generate(TrigramBackend(TARGET), PROMPT, GenerationConfig(max_new_tokens=12, sampling=greedy,
                                                                      verifier=v),
                     test_distribution.model_drafter("far", greedy), 3).token_ids
            for v in ("block", "rejection")]
    assert runs[0] == runs[1]


@pytest.mark.parametrize("verifier,seed,temperature,block", [
    ("auto", None, 1.0, True),  # the unseeded default
    ("auto", 5, 1.0, False),  # a seed: coupled
    ("block", 5, 1.0, True),  # asked for: seeded by the generator, not coupled
    ("rejection", None, 1.0, False),
    ("coupled", None, 1.0, False),
    ("auto", None, 0.0, False),  # greedy: token by token, the same drafts kept
])
def test_which_generations_verify_as_a_block(verifier, seed, temperature, block):
    config = GenerationConfig(sampling=SamplingConfig(temperature), seed=seed, verifier=verifier)
    assert config.block is block
