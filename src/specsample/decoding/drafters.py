"""Drafters propose the next tokens; the target decides which to keep.

How many tokens a round drafts, and from which source, is the policy's decision
(control.py: a fixed K or the planner). A drafter offers what it could
draft, carries out the plan it is handed and is told how many of its drafts the
target accepted (plans.py); it never sees the policy.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from ..backends.base import Backend, claim_cache, common_prefix_length, finite_logits, holds_cache
from ..output.constraints import GrammarState, allows_any, mask_logits
from .plans import FORCED, MODEL, DraftCall, Offer, Plan, Source, lookup_source
from .sampling import Sampler, SamplingConfig


@dataclass
class Draft:
    tokens: torch.Tensor  # [m] int64
    probs: torch.Tensor | None  # [m, vocab]: what each draft was drawn from; None: one-hot drafts
    sources: list[Source] = field(default_factory=list)  # [m]
    confidences: list[float | None] = field(default_factory=list)  # [m]
    calls: list[DraftCall] = field(default_factory=list)  # draft model calls made for it

    @staticmethod
    def empty(calls: list[DraftCall] | None = None) -> "Draft":
        return Draft(torch.empty(0, dtype=torch.long), None, calls=calls or [])

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def join(self, other: "Draft") -> "Draft":
        """This draft, then `other` after it (one-hot rows where one side has none)."""
        probs = None
        if self.probs is not None or other.probs is not None:
            vocab = (self.probs if self.probs is not None else other.probs).shape[-1]
            probs = torch.cat([_with_rows(self, vocab), _with_rows(other, vocab)])
        return Draft(torch.cat([self.tokens, other.tokens]), probs, self.sources + other.sources,
                     self.confidences + other.confidences, self.calls + other.calls)


def _with_rows(draft: Draft, vocab: int) -> torch.Tensor:
    return draft.probs if draft.probs is not None else _one_hot(draft.tokens.tolist(), vocab)


def _one_hot(tokens: list[int], vocab: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(tokens, dtype=torch.long), vocab).float()  # [m, vocab]


class Drafter(Protocol):
    name: str
    calls: int  # model forward calls made so far
    model_backend: Backend | None  # the draft model's backend; None: no model

    def offer(self, context: list[int], k: int, grammar: GrammarState | None = None) -> Offer:
        """What it could draft after context, at most k tokens from each source."""
        ...

    def draft(self, context: list[int], plan: Plan, sampler: Sampler, grammar: GrammarState | None = None) -> Draft:
        """The plan's drafts after context (none when it plans none). A drafter that
        draws uses the generation's sampler: the penalties' history, and under
        coupling the noise of each position. With a grammar (standing at the end of
        context) every proposal is one it allows, each followed by the tokens it then
        forces; the grammar is left where it stood."""
        ...

    def accept(self, num_accepted: int) -> None:
        """How many of the drafts it made this round the target accepted."""
        ...

    # Optionally, end(text): the generation is over and `text` (prompt and answer) is
    # all of it (finish() below; the suffix drafter keeps it for later requests).


def draft_round(drafter: Drafter, context: list[int], k: int, sampler: Sampler, plan: Callable[[Offer], Plan],
                grammar: GrammarState | None = None, free: bool = False) -> Draft:
    """A round's drafts, up to k of the drafter's own, as `plan` (the policy's) makes
    of its offer. With a grammar, the tokens it forces here come first, as drafts of
    their own source that the target accepts with probability 1 (their rows are
    one-hot); the drafter drafts after them. `free`: a row the loop holds predicts the
    round's first token, so a plain step needs no call (Offer.free), unless forced
    tokens come first (their round makes a call anyway)."""
    if grammar is None:
        return drafter.draft(context, plan(_freed(drafter.offer(context, k), free)), sampler)
    forced = grammar.advance_forced()
    rest = Draft.empty()
    k = min(k, grammar.room)
    if k > 0 and not grammar.done:
        context = context + forced
        rest = drafter.draft(context, plan(_freed(drafter.offer(context, k, grammar), free and not forced)), sampler,
                             grammar)
    grammar.rollback(len(forced))
    return lookup_draft(forced, FORCED).join(rest)


def _freed(offer: Offer, free: bool) -> Offer:
    """The offer, marked free where it is (a copy only then: this runs every round)."""
    return dataclasses.replace(offer, free=True) if free else offer


def tell(drafter: Drafter, draft: Draft, num_accepted: int) -> None:
    """The round's outcome, told as the drafter counts it: a grammar's forced tokens
    before its own drafts (draft_round) are not its."""
    lead = next((i for i, source in enumerate(draft.sources) if source != FORCED), len(draft))
    drafter.accept(max(0, num_accepted - lead))


class ModelDrafter:
    """A small language model that drafts autoregressively with its own KV cache.

    Its cache is kept in step with the accepted text by comparing the cached tokens
    with the context at the start of each round: after a rejection the cache holds
    drafts that were thrown away (rolled back); after a full accept it lacks the last
    draft token, which was sampled but never fed back (the classic off-by-one), and
    the bonus token. Both are fed in the first draft call of the next round, as is
    any text emitted by plain target steps while the draft sat idle. When another
    user has claimed the backend since (another drafter on it, in an interleaved
    stream), nothing cached can be trusted and the whole context is fed again.

    `window` bounds what the draft must read before it can draft: beyond the first
    `head` tokens of the context (where a chat template puts the system prompt and
    the instruction), it reads at most the last `window` tokens before the point where
    it starts, and everything after. Its proposals change; the output distribution
    does not, since verification only needs the distribution each draft was drawn
    from. Example with head 2, window 3: a prompt [a b c d e f g] is read as
    [a b e f g], five tokens instead of seven; later rounds feed only what is new, and
    when more than 3 unseen tokens pile up (plain target steps while the draft sat
    idle) the draft reads the head and the last 3 afresh rather than all of them.
    """

    def __init__(self, backend: Backend, sampling: SamplingConfig, window: int | None = None, head: int = 0):
        if window is not None and window < 1:
            raise ValueError(f"the draft's context window must be >= 1 token, got {window}")
        if head < 0:
            raise ValueError(f"the draft's context head must be >= 0 tokens, got {head}")
        self.backend = backend
        self.sampling = sampling
        self.window, self.head = window, head
        # Keep what the model's cache holds of the text from an earlier generation, as the
        # backend counts it (cache_prompt: reuse_model_cache); else start it afresh.
        self.reuse_cache = False
        self.name = backend.name
        self.calls = 0
        self.clock = time.perf_counter
        self._start = 0  # context index where the draft's view resumes after the head
        self._cached: list[int] = []  # the tokens in the backend's cache: the start of the view
        self._claim: object | None = None  # ours on the backend (claim_cache); None: not yet taken
        self._drafts_at: int | None = None  # where this round's drafts start in _cached; None: none drafted

    @property
    def model_backend(self) -> Backend:
        return self.backend

    def lag(self, context: list[int]) -> int:
        """Tokens the next draft call must feed before it can draft."""
        start, common = self._view(context)
        return len(self._tokens(context, start)) - common

    def _tokens(self, context: list[int], start: int) -> list[int]:
        """What the draft reads of the context when its view resumes at `start`."""
        return context[: min(self.head, start)] + context[start:]

    def _view(self, context: list[int]) -> tuple[int, int]:
        """(start, common): where the view resumes, and how many of its first tokens
        the cache holds already. The current view is kept while it fits the window
        and still shows this text; otherwise it restarts at the last `window` tokens."""
        if holds_cache(self.backend, self._claim, len(self._cached)):
            cached = self._cached
        else:
            cached = (self.backend.cached_tokens() or []) if self.reuse_cache else []
        over = self.window is not None and len(context) > self.head + self.window
        restart = len(context) - self.window if over else 0
        for start in (self._start, restart):
            if start >= len(context):
                continue
            view = self._tokens(context, start)
            # At least one token must be fed to get the next-token logits.
            common = min(common_prefix_length(cached, view), len(view) - 1)
            fits = self.window is None or len(view) - common <= self.window
            same_text = start == 0 or common > min(self.head, start)
            if start == restart or (fits and same_text):
                return start, common
        raise AssertionError("unreachable: the restart view always qualifies")

    def offer(self, context, k, grammar=None) -> Offer:
        self._drafts_at = None
        return Offer({MODEL: k}, self.lag(context))

    def draft(self, context, plan, sampler, grammar=None) -> Draft:
        """Draft up to `plan.limit` tokens, `plan.length` of them unless the plan's
        extent revises it; with a grammar, each drawn from the draft's distribution
        masked by the grammar state after the drafts before it, and followed by the
        tokens it forces."""
        if plan.catch_up and not plan.length:
            return self._catch_up(context, plan.catch_up)
        if plan.source != MODEL or not plan.length:
            return Draft.empty()
        planned, limit = plan.length, plan.limit
        start, common = self._view(context)
        if not holds_cache(self.backend, self._claim, len(self._cached)):  # someone else used the backend
            self._claim = claim_cache(self.backend)
        self.backend.rollback(common)
        view = self._tokens(context, start)
        self._start, self._cached = start, view[:common]
        feed = view[common:]
        self._drafts_at = len(view)
        tokens, rows, sources, confidences, calls = [], [], [], [], []
        i = 0
        while i < min(planned, limit) and (grammar is None or grammar.room > 0 and not grammar.done):
            t0 = self.clock()
            logits = finite_logits(self.backend.score(feed, num_logits=1), self.name)  # [1, vocab]
            calls.append(DraftCall(len(feed), self.clock() - t0))
            self.calls += 1
            self._cached += feed
            if grammar is not None:
                logits = mask_logits(logits, [grammar.allowed()])
                if not allows_any(logits):  # a truncated draft vocabulary missed every allowed token
                    break
            probs = sampler.probs(logits, context + tokens, self.sampling)  # [1, vocab]
            confidence = draft_confidence(logits, probs, self.sampling)
            # Decided from q_i alone, before x_i is drawn (control.py says why).
            planned = plan.extent_at(i, confidence)
            if planned <= i:
                break
            token = int(sampler.draw(probs, len(context) + len(tokens))[0])
            tokens.append(token)
            rows.append(probs)
            sources.append(MODEL)
            confidences.append(confidence)
            feed = [token]  # not fed after the last draft: nobody needs its logits
            if grammar is not None:
                grammar.advance(token)
                forced = grammar.advance_forced()  # free to verify, and the draft model reads them
                tokens += forced
                rows.append(_one_hot(forced, probs.shape[-1]))
                sources += [FORCED] * len(forced)
                confidences += [None] * len(forced)
                feed += forced
            i += 1
        if grammar is not None:
            grammar.rollback(len(tokens))
        if not tokens:
            return Draft.empty(calls)
        return Draft(torch.tensor(tokens), torch.cat(rows), sources, confidences, calls)  # rows: [m, vocab]

    def _catch_up(self, context: list[int], most: int) -> Draft:
        """Read up to `most` tokens of the text the draft has not read, drafting none
        (all but the last: the round that drafts feeds that one for its logits)."""
        start, common = self._view(context)
        if not holds_cache(self.backend, self._claim, len(self._cached)):
            self._claim = claim_cache(self.backend)
        self.backend.rollback(common)
        view = self._tokens(context, start)
        feed = view[common : min(common + most, len(view) - 1)]
        self._start, self._cached = start, view[:common]
        if not feed:
            return Draft.empty()
        t0 = self.clock()
        self.backend.score(feed, num_logits=1)
        self.calls += 1
        self._cached += feed
        return Draft.empty([DraftCall(len(feed), self.clock() - t0)])

    def accept(self, num_accepted: int) -> None:
        """Drop the rejected drafts from the cache now. The next round checks the
        cache against its context anyway (plain steps, other users, the window)."""
        if self._drafts_at is not None and holds_cache(self.backend, self._claim, len(self._cached)):
            del self._cached[self._drafts_at + num_accepted :]
            self.backend.rollback(len(self._cached))
        self._drafts_at = None


def draft_confidence(logits: torch.Tensor, probs: torch.Tensor, sampling: SamplingConfig) -> float:
    """The draft's top probability at this position. Greedy drafts are one-hot, so
    there the plain softmax of the logits says how sure the draft is."""
    if sampling.greedy:
        logits = logits.float()
        return float(torch.exp(logits.max() - torch.logsumexp(logits, dim=-1).max()))
    return float(probs.max())


class NgramDrafter:
    """Prompt lookup: propose what followed the most recent earlier occurrence of the
    last n tokens, trying n = max_ngram down to min_ngram.

    Example with max_ngram=2, context [1, 2, 3, 4, 2, 3], k=3: the suffix [2, 3]
    occurred at positions 1..2, followed by [4, 2, 3], so the draft is [4, 2, 3].
    The draft has no distribution: verification treats it as one-hot. Each match
    length is its own source for the policy (lookup_source(2), "ngram2" in the
    statistics): longer matches are better guesses.

    An index maps every n-gram that is followed by at least one token to its latest
    start, and grows with the context, so a lookup costs O(max_ngram), not a scan
    of the context (which a long answer would make quadratic).
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError("need 1 <= min_ngram <= max_ngram")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.name = f"ngram(n={min_ngram}..{max_ngram})"
        self.calls = 0  # no model
        self.model_backend = None
        self._found: list[int] = []  # the lookup offered this round
        self._indexed: list[int] = []  # the context the index describes
        self._latest: dict[tuple[int, ...], int] = {}  # n-gram -> latest start followed by a token

    def lookup(self, context: list[int], k: int) -> tuple[list[int], int]:
        """Up to k tokens that followed the longest matching suffix, and its length."""
        self._index(context)
        for n in range(min(self.max_ngram, len(context) - 1), self.min_ngram - 1, -1):
            start = self._latest.get(tuple(context[-n:]))
            if start is not None:
                return context[start + n : start + n + k], n
        return [], 0

    def _index(self, context: list[int]) -> None:
        done = len(self._indexed)
        if len(context) < done or context[:done] != self._indexed:  # another sequence
            self._latest, done = {}, 0
        # New n-grams are those whose follower is a new token: starts j with
        # done - n <= j <= len(context) - n - 1.
        for end in range(max(done, 1), len(context)):  # end: index of the follower
            for n in range(self.min_ngram, min(self.max_ngram, end) + 1):
                self._latest[tuple(context[end - n : end])] = end - n
        self._indexed = list(context)

    def offer(self, context, k, grammar=None) -> Offer:
        """The lookup, cut where a grammar forbids it."""
        tokens, n = self.lookup(context, k)
        if grammar is not None:
            tokens = grammar.accepted_prefix(tokens)
        self._found = tokens
        if not tokens:
            return Offer({})
        source = lookup_source(n)
        return Offer({source: len(tokens)}, 0, ((source, tuple(tokens)),))

    def draft(self, context, plan, sampler, grammar=None) -> Draft:
        if plan.source is None or plan.source.kind != "lookup":
            return Draft.empty()
        return lookup_draft(self._found[: plan.length], plan.source, grammar)

    def accept(self, num_accepted: int) -> None:
        pass  # the index follows the context as it comes


def lookup_draft(tokens: list[int], source: Source, grammar: GrammarState | None = None,
                 confidences: list[float] | None = None) -> Draft:
    """One-hot drafts (`confidences`: each one's, where the source has them); with a
    grammar, followed by the tokens it forces after them."""
    if not tokens:
        return Draft.empty()
    sources = [source] * len(tokens)
    confidences = list(confidences) if confidences is not None else [None] * len(tokens)
    if grammar is not None:
        for token in tokens:
            grammar.advance(token)
        forced = grammar.advance_forced()
        grammar.rollback(len(tokens) + len(forced))
        tokens, sources = tokens + forced, sources + [FORCED] * len(forced)
        confidences += [None] * len(forced)
    return Draft(torch.tensor(tokens, dtype=torch.long), None, sources, confidences)


class HybridDrafter:
    """The draft model beside drafters that copy text: context lookup and, when given,
    the suffix index of served text (suffix.SuffixDrafter); with neither given,
    context lookup. Under a fixed K a copy when one is found, the model otherwise; with
    the adaptive policy, whichever is expected to pay more this round (each source and
    match length has its own acceptance estimates). `model` may be None: copies alone."""

    def __init__(self, model: ModelDrafter | None, ngram: NgramDrafter | None = None, suffix=None):
        self.model = model
        self.ngram = ngram if ngram is not None or suffix is not None else NgramDrafter()
        self.suffix = suffix
        # Under a fixed K the first copy found is drafted: a suffix match spans more tokens.
        self.copiers = [d for d in (suffix, self.ngram) if d is not None]
        self.name = f"hybrid({', '.join(d.name for d in self.copiers + ([model] if model else []))})"

    @property
    def calls(self) -> int:
        return self.model.calls if self.model is not None else 0

    @property
    def model_backend(self) -> Backend | None:
        return self.model.backend if self.model is not None else None

    def offer(self, context, k, grammar=None) -> Offer:
        offers = [d.offer(context, k, grammar) for d in self.copiers]
        model = self.model.offer(context, k) if self.model is not None else Offer({})
        available = dict(model.available)
        for offer in offers:
            available.update(offer.available)
        return Offer(available, model.lag, tuple(found for offer in offers for found in offer.lookups))

    def draft(self, context, plan, sampler, grammar=None) -> Draft:
        if plan.source == MODEL:
            return self.model.draft(context, plan, sampler, grammar)
        # A plain step or a lookup's drafts; the draft model may read a chunk of its
        # unread text beside them (plans.Plan.catch_up), whose call the round counts.
        read = self.model.draft(context, Plan(None, 0, catch_up=plan.catch_up), sampler) if plan.catch_up \
            else Draft.empty()
        drafter = None if plan.source is None else {"lookup": self.ngram, "suffix": self.suffix}.get(plan.source.kind)
        return read if drafter is None else read.join(drafter.draft(context, plan, sampler, grammar))

    def accept(self, num_accepted: int) -> None:
        if self.model is not None:
            self.model.accept(num_accepted)

    def end(self, text: list[int]) -> None:
        if self.suffix is not None:
            self.suffix.end(text)


def finish(drafter: Drafter | None, text: list[int]) -> None:
    """A generation is over, and `text` is all of it, prompt and answer: a drafter that
    learns from served text (suffix.SuffixDrafter) keeps it. Drafters without an `end`
    (those written before it) have nothing to do."""
    end = getattr(drafter, "end", None)
    if end is not None:
        end(text)


def reuse_model_cache(drafter: Drafter | None) -> None:
    """A generation with cache_prompt: its draft model keeps, too, what its cache holds
    of the prompt already. The draft's numbers move acceptance only, never the output
    distribution."""
    model = drafter.model if isinstance(drafter, HybridDrafter) else drafter
    if isinstance(model, ModelDrafter):
        model.reuse_cache = True
