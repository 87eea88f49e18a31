"""Modified rejection sampling (Chen et al. 2023, Algorithm 2; Leviathan et al. 2023).

Vocabulary, after vLLM: draft tokens that pass are *accepted*; the token drawn after
the first rejection is *recovered*; the extra token drawn from the last target
distribution when every draft passes is the *bonus* token.

Worked example, K = 2, vocabulary {a, b, c}:

    draft_tokens  = [a, b]
    draft_probs   = [[.6, .3, .1],      # distribution a was drawn from
                     [.2, .7, .1]]      # distribution b was drawn from
    target_probs  = [[.3, .5, .2],      # target after the prefix
                     [.1, .8, .1],      # target after prefix + a
                     [.4, .4, .2]]      # target after prefix + a + b

    a is accepted with probability min(1, .3/.6) = .5. If it is rejected, the round
    ends with a token recovered from norm(max(0, target - draft)) = norm([0, .2, .1]),
    i.e. b with 2/3, c with 1/3: together with the accepted mass this is exactly
    [.3, .5, .2]. If a is accepted, b is accepted with min(1, .8/.7) = 1, and the bonus
    token is drawn from [.4, .4, .2].
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .sampling import coupled_choice, sample


@dataclass(frozen=True)
class Verdict:
    tokens: list[int]  # accepted drafts, then one recovered or bonus token
    num_accepted: int  # how many drafts were accepted (0..K)


def verify(
    draft_tokens: torch.Tensor,  # [k] int64
    draft_probs: torch.Tensor | None,  # [k, vocab]; None for drafts without a distribution
    target_probs: torch.Tensor,  # [k + 1, vocab]
    generator: torch.Generator | None,
) -> Verdict:
    """Accept a prefix of the drafts so that the emitted tokens follow target_probs.

    A draft with no distribution (n-gram lookup) is treated as one-hot: token x is
    accepted with probability target_probs(x), and on rejection the recovered token is
    drawn from the target with x removed and renormalised.
    """
    k = draft_tokens.shape[0]
    target_probs = target_probs.float()
    positions = torch.arange(k)
    target_of_draft = target_probs[positions, draft_tokens]  # [k]
    if draft_probs is None:
        draft_of_draft = torch.ones(k)
    else:
        draft_probs = draft_probs.float()
        draft_of_draft = draft_probs[positions, draft_tokens]  # [k]
    # Accept iff u < target/draft; multiplied out so a draft prob of 0 cannot divide.
    uniforms = torch.rand(k, generator=generator)
    accepted = (uniforms * draft_of_draft < target_of_draft).tolist()  # [k]
    n = accepted.index(False) if False in accepted else k  # the first rejected
    draft_row = None
    if n < k and draft_probs is None:
        draft_row = torch.zeros_like(target_probs[n])
        draft_row[draft_tokens[n]] = 1.0
    elif n < k:
        draft_row = draft_probs[n]
    return _emit(draft_tokens, n, target_probs, draft_row, generator)


def _emit(draft_tokens: torch.Tensor, n: int, target_probs: torch.Tensor, draft_row: torch.Tensor | None,
          generator: torch.Generator | None, weight: float = 1.0) -> Verdict:
    """A verdict that keeps the first n drafts, then one token: after all k of them the
    bonus, drawn from the target's row after the last; else one recovered from the
    residual of row n against `draft_row`, the rejected draft's row (verify and
    verify_block alike; `weight`: block verification's weight of the kept prefix)."""
    k = draft_tokens.shape[0]
    if n == k:
        last = sample(target_probs[k : k + 1], generator)
    else:
        last = sample(residual_distribution(target_probs[n], draft_row, weight)[None], generator)
    return Verdict(draft_tokens[:n].tolist() + last.tolist(), n)


def residual_distribution(
    target_row: torch.Tensor,  # [vocab] float32
    draft_row: torch.Tensor,  # [vocab] float32
    weight: float = 1.0,
) -> torch.Tensor:
    """norm(max(0, weight * target - draft)), or the target itself when that has no mass.

    A rejection implies target(x) < draft(x), so mathematically the residual has
    positive mass; when target and draft agree to within rounding it can still sum to
    zero (or underflow). Its limit as draft -> target is the target, so use that.
    `weight` is block verification's weight of the accepted prefix (verify_block).
    """
    residual = (weight * target_row - draft_row).clamp_min(0.0)
    total = residual.sum()
    mass = float(total)  # a float32 sum, exactly; compared in Python (torch.isfinite is several ops)
    if not math.isfinite(mass) or mass <= torch.finfo(torch.float32).tiny:
        return target_row
    return residual / total


def verify_block(
    draft_tokens: torch.Tensor,  # [k] int64
    draft_probs: torch.Tensor | None,  # [k, vocab]; None for drafts without a distribution
    target_probs: torch.Tensor,  # [k + 1, vocab]
    generator: torch.Generator | None,
) -> Verdict:
    """Block verification (Sun et al., ICLR 2025, Algorithm 2): the drafts are judged
    as one block, and the longest prefix is kept that the block as a whole allows, where
    `verify` stops at the first draft it rejects. The emitted tokens follow target_probs
    all the same, and the expected number accepted is at least verify's, for every
    target and draft (the paper proves it the most any verifier of one draft chain can
    accept). block_acceptance gives the rule; here the draws.

    Worked example, K = 2, vocabulary {a, b}, the same rows at every position:

        draft_probs  = [2/3, 1/3]     target_probs = [1/3, 2/3]

    Drafts [a, b]: `verify` keeps a with probability min(1, (1/3) / (2/3)) = 1/2. The
    block as a whole is drafted with probability 2/3 * 1/3 = 2/9 and wanted with
    1/3 * 2/3 = 2/9: block verification keeps both always. Drafts [a, a]: drafted with
    4/9, wanted with 1/9; both are kept with probability 1/4 (verify: 1/2 * 1/2, the
    same), and a alone never (verify: 1/4 of the time): [a, b] kept whole (2/9) and
    [a, a] kept whole (4/9 * 1/4) already give a the 1/3 the target wants, so the
    residual after a at its weight 1/2, max(0, 1/2 * target - draft), is empty, and the
    round emits b, recovered. Over the four blocks, 11/9 drafts accepted per round
    against verify's 10/9. A draft without a distribution (a lookup: one-hot rows)
    leaves nothing to pay back: there the two rules keep each prefix equally often.
    """
    k = draft_tokens.shape[0]
    target_probs = target_probs.float()
    if draft_probs is None:
        draft_probs = torch.nn.functional.one_hot(draft_tokens, target_probs.shape[-1]).float()  # [k, vocab]
    draft_probs = draft_probs.float()
    weights, stops = block_acceptance(draft_tokens, draft_probs, target_probs)
    # Scan back from the whole block: prefix i is kept if its uniform falls under
    # stops[i - 1] and no longer prefix was; the empty prefix if none.
    kept = (torch.rand(k, generator=generator) < stops).tolist()
    n = max((i + 1 for i, keep in enumerate(kept) if keep), default=0)
    return _emit(draft_tokens, n, target_probs, draft_probs[n] if n < k else None, generator, weights[n])


def block_acceptance(
    draft_tokens: torch.Tensor,  # [k] int64
    draft_probs: torch.Tensor,  # [k, vocab] float32
    target_probs: torch.Tensor,  # [k + 1, vocab] float32
) -> tuple[list[float], torch.Tensor]:
    """Block verification's rule, without draws: (weights [k + 1], stops [k]).

    weights[i], the weight of the prefix of i drafts: 1 for none, then
    min(1, weights[i - 1] * target(x_i) / draft(x_i)); below 1, the prefix was drafted
    more often than the target wants it, by that factor.
    stops[i - 1], for the prefix of i drafts (i = 1..k), the probability of keeping it
    given that no longer prefix was kept: weights[k] for the whole block; for a shorter
    one, its residual mass r = sum(max(0, weights[i] * target_i - draft_i)) over the row
    after it, against r + 1 - weights[i]. After a kept prefix of i < k drafts the next
    token is drawn from norm(max(0, weights[i] * target_i - draft_i)) (a
    residual_distribution with weights[i]); after the whole block, the bonus from the
    last target row.
    """
    k = draft_tokens.shape[0]
    if k == 0:
        return [1.0], torch.empty(0)
    positions = torch.arange(k)
    weights = [1.0]
    for wanted, drafted in zip(target_probs[positions, draft_tokens].tolist(),
                               draft_probs[positions, draft_tokens].tolist()):
        # Multiplied out, so that a draft probability of 0 cannot divide.
        scaled = weights[-1] * wanted
        weights.append(0.0 if wanted <= 0 else 1.0 if scaled >= drafted else scaled / drafted)
    inner = torch.tensor(weights[1:k], dtype=torch.float32)[:, None]  # [k - 1, 1]: prefixes of 1..k-1 drafts
    mass = (inner * target_probs[1:k] - draft_probs[1:k]).clamp_min(0.0).sum(-1)  # [k - 1]
    denominator = mass + 1.0 - inner[:, 0]
    # No residual and a weight of 1 (0 / 0): nothing was over-drafted, so keep the prefix.
    shorter = torch.where(denominator > torch.finfo(torch.float32).tiny, mass / denominator, torch.ones_like(mass))
    return weights, torch.cat([shorter, torch.tensor([weights[k]], dtype=torch.float32)])


def verify_coupled(
    draft_tokens: torch.Tensor,  # [k] int64
    target_probs: torch.Tensor,  # [k + 1, vocab]
    noise: torch.Tensor,  # [k + 1, vocab]: race_noise of the positions the rows predict
) -> Verdict:
    """Drafter-invariant verification (Daliri, Musco and Suresh 2024): the target's own
    choice at each position is argmax(target_probs / noise), a draw from the target
    (sampling.race_noise); a draft is accepted iff it equals that choice, and the first
    mismatch emits the target's choice instead. So the emitted tokens are the ones the
    target would have drawn alone with the same noise, whatever was drafted, and each
    follows the target's distribution. A draft model proposes with the same noise
    (Sampler.draw), which is what makes its guesses agree often.

    Worked example, K = 2, vocabulary {a, b, c}, noise E per position:

        target_probs = [[.3, .5, .2],     E = [[.1, 2.0, .9],    p / E = [3.0, .25, .22]  -> a
                        [.1, .8, .1],          [.5, .4, 3.0],            [.2, 2.0, .03]   -> b
                        [.4, .4, .2]]          [1.0, .2, .25]]           [.4, 2.0, .8]    -> b
        draft_tokens = [a, c]: a equals the choice and is accepted; c is not b, so the
        round emits [a, b], one accepted draft. Drafts [a, b] would emit [a, b, b].

    Unlike modified rejection sampling, acceptance does not use the draft's
    probabilities: a draft with the same noise agrees where its own race has the same
    winner, at least (1 - TV) / (1 + TV) of the time (TV: total variation between the
    two distributions) against 1 - TV for rejection sampling.
    """
    k = draft_tokens.shape[0]
    choices = coupled_choice(target_probs.float(), noise).tolist()  # [k + 1]
    drafts = draft_tokens.tolist()
    n = 0
    while n < k and drafts[n] == choices[n]:
        n += 1
    return Verdict(drafts[:n] + [choices[n]], n)
