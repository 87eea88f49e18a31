"""One round of one sequence: draft, score, verify, roll back (gpt-fast's
`speculative_decode`). The round decides which tokens come next; the loop in
generate.py places them (stop strings, EOS, the grammar, the budget, statistics).
One round function for every stream: how it gets its drafts and calls the target is
its TargetCalls (here: in the round; overlap.Overlap: on a thread, drafting the next
block meanwhile)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..backends.base import Backend, finite_logits
from ..output.constraints import GrammarState, constrained_logits
from .drafters import Draft, Drafter, draft_round
from .plans import Policy, RoundReport
from .sampling import Sampler, SamplingConfig
from .verify import Verdict, verify, verify_block, verify_coupled


@dataclass
class Round:
    """What one round did."""

    draft: Draft
    verdict: Verdict
    fed: list[int]  # what the target scored: the pending token (if any), then the drafts
    logits: torch.Tensor  # [m + 1, vocab]: the target's rows, finite
    target_probs: torch.Tensor  # [m + 1, vocab]: what verify drew from
    draft_calls: int  # draft model calls made
    started: float  # the clock when the round began
    draft_seconds: float
    target_seconds: float  # the clock around score(): what this sequence waited for its rows
    # Drafting during the target's call (overlap.py): the seconds of the call spent
    # drafting the next block, the row that block starts from when it is kept
    # ([1, vocab]), and whether this round's drafts were such a block.
    hidden_seconds: float = 0.0
    carry: torch.Tensor | None = None
    predrafted: bool = False

    def report(self, emitted: list[int], round_seconds: float) -> RoundReport:
        return RoundReport(self.draft.sources, self.draft.confidences, self.verdict.num_accepted, tuple(emitted),
                           self.target_probs, len(self.fed), self.target_seconds, self.draft.calls, round_seconds)


@dataclass
class Called:
    """A round's target call, as its TargetCalls made it."""

    rows: torch.Tensor | None  # [len(fed), vocab]; None: nothing was fed
    seconds: float  # the call's
    hidden: float = 0.0  # of those, the seconds spent drafting the next block meanwhile
    drafting: float = 0.0  # seconds the round spent drafting during the call
    draft_calls: int = 0  # draft model calls made during the call


class TargetCalls:
    """How a round gets its drafts and calls the target: here, drafting when the round
    begins and calling the target on the round's own thread. overlap.Overlap calls it
    on a thread of its own, drafts the next block meanwhile and hands a kept block to
    the next round; play_round is the same round either way."""

    def drafts(self, drafter: Drafter | None, policy: Policy, sampler: Sampler, grammar: GrammarState | None,
               context: list[int], room: int, free: bool) -> tuple[Draft, int, bool]:
        """The round's drafts (draft_step), the draft model calls they took, and whether
        they were drafted before the round began (a kept block)."""
        draft, calls = draft_step(drafter, policy, sampler, grammar, context, room, free)
        return draft, calls, False

    def score(self, target: Backend, fed: list[int], clock, drafter: Drafter | None, policy: Policy,
              sampler: Sampler, context: list[int], draft: Draft, room: int) -> Called:
        """target.score(fed), a row for every token fed, timed by `clock`."""
        t1 = clock()
        rows = target.score(fed, num_logits=len(fed)) if fed else None  # [len(fed), vocab]
        return Called(rows, clock() - t1)

    def settle(self, draft: Draft, verdict: Verdict, logits: torch.Tensor) -> tuple[Verdict, torch.Tensor | None]:
        """The verdict the round emits, and the row ([1, vocab]) a block kept for the
        next round starts from (None: none kept)."""
        return verdict, None


IN_ROUND = TargetCalls()


def play_round(target: Backend, drafter: Drafter | None, policy: Policy, sampler: Sampler, sampling: SamplingConfig,
               grammar: GrammarState | None, context: list[int], carried: torch.Tensor | None, room: int,
               clock, calls: TargetCalls = IN_ROUND) -> Round:
    """One round after `context`, of which the target holds all but the last token
    unless `carried` ([1, vocab], the prefill's last row, or the row a kept block
    starts from: Round.carry) already predicts the next; `room`: tokens the sequence
    may still emit; `calls`: how the target is called (TargetCalls)."""
    # 1. Draft: the policy picks the source and how many (0 = a plain target step),
    #    never more than we could still emit. Tokens a grammar forces come first,
    #    free (drafters.draft_round). Overlapped, a block kept from the last round.
    t0 = clock()
    draft, draft_calls, predrafted = calls.drafts(drafter, policy, sampler, grammar, context, room,
                                                  carried is not None)
    t1 = clock()

    # 2. Score pending token + drafts in one target call: m+1 distributions.
    #    Overlapped, the next block is drafted meanwhile.
    base = target.length
    pending = [context[-1]] if carried is None else []
    fed = pending + draft.tokens.tolist()
    called = calls.score(target, fed, clock, drafter, policy, sampler, context, draft, room)
    logits = with_carried(carried, called.rows)  # [len(fed) (+1), vocab]

    # 3. Accept a prefix of the drafts, then one recovered or bonus token (overlapped:
    #    none after a whole block accepted, whose next block is kept instead).
    logits, target_probs, verdict = judge(target, sampler, sampling, grammar, context, draft, logits)
    verdict, carry = calls.settle(draft, verdict, logits)
    # 4. Keep pending + accepted drafts; the new last token is fed next round.
    target.rollback(base + len(pending) + verdict.num_accepted)
    return Round(draft, verdict, fed, logits, target_probs, draft_calls + called.draft_calls, t0,
                 (t1 - t0) + called.drafting, called.seconds, called.hidden, carry, predrafted)


def draft_step(drafter: Drafter | None, policy: Policy, sampler: Sampler, grammar: GrammarState | None,
               context: list[int], room: int, free: bool = False) -> tuple[Draft, int]:
    """A round's drafts, as the policy plans them, and the draft model calls they took;
    `free`: a row the loop holds predicts the round's first token (Offer.free)."""
    if drafter is None:  # nothing drafts: no policy is needed (stream() takes none)
        return Draft.empty(), 0
    budget = min(policy.k_max, room - 1)
    if budget <= 0:
        return Draft.empty(), 0
    calls_before = drafter.calls
    draft = draft_round(drafter, context, budget, sampler, policy.plan, grammar, free)
    return draft, drafter.calls - calls_before


def with_carried(carried: torch.Tensor | None, logits: torch.Tensor | None) -> torch.Tensor:
    """The round's rows: the carried one ([1, vocab]) first, when there is one."""
    if carried is None:
        return logits
    return carried if logits is None else torch.cat([carried, logits])


def judge(target: Backend, sampler: Sampler, sampling: SamplingConfig, grammar: GrammarState | None,
          context: list[int], draft: Draft, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, Verdict]:
    """Verify the drafts against the target's rows ([m + 1, vocab]): the rows made
    finite, the distributions verify drew from ([m + 1, vocab]), and the verdict. Each
    row becomes the distribution the sampling controls draw from, over what the
    grammar allows after its own prefix; row j follows the text and drafts[:j], which
    the penalties count."""
    m = len(draft)
    logits = finite_logits(logits, target.name)  # [m + 1, vocab]
    allowed = None if grammar is None else grammar.rows_allowed(draft.tokens.tolist())
    target_probs = sampler.probs(constrained_logits(logits, allowed), context + draft.tokens.tolist(),
                                 sampling)  # [m + 1, vocab]
    if sampler.coupled:
        verdict = verify_coupled(draft.tokens, target_probs, sampler.noise(len(context), m + 1, logits.shape[-1]))
    elif sampler.block and draft.probs is not None:
        verdict = verify_block(draft.tokens, draft.probs, target_probs, sampler.generator)
    else:  # one-hot drafts (lookups, forced tokens) leave block verification nothing to gain: verify_block says why
        verdict = verify(draft.tokens, draft.probs, target_probs, sampler.generator)
    return logits, target_probs, verdict
