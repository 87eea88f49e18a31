"""What a round's drafting is agreed in: the drafter offers, the policy plans, the
drafter carries the plan out and hears how it fared.

    offer  = drafter.offer(context, k)     sources it could draft from, how many tokens each
    plan   = policy.plan(offer)            which source, how many tokens, the rule for cutting short
    draft  = drafter.draft(context, plan)  the drafts, with each one's source and confidence
    ...verify...
    drafter.accept(n); policy.observe(RoundReport(...))

Neither side sees the other: the drafter knows a Plan, the policy an Offer and a
RoundReport (llama.cpp's common_speculative begin / draft / accept; transformers'
CandidateGenerator.update_candidate_strategy).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class Source:
    """Where a draft token comes from: the draft model, a grammar (tokens it forces,
    drafted for free and always accepted), a context lookup that matched the last
    `match` tokens (a longer match is a better guess, so each length is its own
    source), or the suffix index of served text (suffix.py; its matches by class:
    at least `match` tokens, the next class's at most)."""

    kind: str  # "model", "forced", "lookup" or "suffix"
    match: int = 0

    @property
    def is_lookup(self) -> bool:
        """Drafts copied from text, one-hot: a context lookup's or the suffix index's."""
        return self.kind in ("lookup", "suffix")

    def __str__(self) -> str:  # the name statistics and JSON output print
        return f"ngram{self.match}" if self.kind == "lookup" else f"suffix{self.match}" if self.kind == "suffix" \
            else self.kind


MODEL = Source("model")
FORCED = Source("forced")


def lookup_source(match: int) -> Source:
    return Source("lookup", match)


SUFFIX_CLASSES = (4, 8, 16, 32)  # a suffix match of n tokens counts as the largest class <= n


def suffix_source(match: int) -> Source:
    return Source("suffix", max([c for c in SUFFIX_CLASSES if c <= match], default=SUFFIX_CLASSES[0]))


@dataclass(frozen=True)
class Offer:
    """What a drafter could draft this round."""

    available: dict[Source, int]  # source -> most tokens it can draft now
    lag: int = 0  # tokens the draft model must read before its first draft
    lookups: tuple[tuple[Source, tuple[int, ...]], ...] = ()  # the lookups found, proposed or not: one a kind
    free: bool = False  # a row the loop holds predicts the round's first token: a plain step needs no call


# Called by the draft model once the draft distribution at position i is known and
# before a token is drawn from it, with that distribution's confidence: how many
# drafts the round should end with. Position i is drawn and proposed iff the answer
# is > i (control.py says why this keeps the output exact).
Extent = Callable[[int, float], int]


@dataclass(frozen=True)
class Plan:
    source: Source | None  # None: a plain target step
    length: int  # drafts planned (0: none)
    limit: int = 0  # the most drafts the round may end with
    extent: Extent | None = None  # None: exactly `length`
    # Tokens of unread text the draft model reads this round without drafting (a long
    # prompt read in pieces while plain steps or a lookup's drafts stream on); only in
    # a round that drafts nothing from the model.
    catch_up: int = 0

    def extent_at(self, i: int, confidence: float) -> int:
        return self.length if self.extent is None else self.extent(i, confidence)


NO_DRAFTS = Plan(None, 0)


def reads_text(fed: int, scored: int, target: bool) -> bool:
    """Whether a call feeding `fed` tokens and asking rows for `scored` of them takes
    in text without scoring it: a prompt's chunk, or the draft model catching up on
    text it has not seen. A round scores every token it feeds the target, and all but
    one of those it feeds the draft (the token before its pending one, after an
    accepted run). Such calls cost by their size, so an average over both kinds says
    nothing about either: the planner keeps them out of a round's window, and bench
    --serve splits them. The one rule for the scheduler's calls and a round's own."""
    return fed - scored > (0 if target else 1)


@dataclass
class DraftCall:
    tokens_fed: int  # tokens the draft model consumed in this call
    seconds: float  # by the clock around it (alone: the call; in a batch, also the wait)
    hidden: bool = False  # made during the target's previous call, which it cost nothing beside (overlap.py)

    @property
    def reads(self) -> bool:
        """It read text (reads_text): a draft call asks for one row (drafters.py)."""
        return reads_text(self.tokens_fed, 1, target=False)


@dataclass(frozen=True)
class ModelCall:
    """One call of a model, as whoever made it timed it: the scheduler in a batch,
    the sequence's own round alone."""

    target: bool  # the target's call, else the draft model's
    tokens: int  # tokens it scored or fed, every sequence's
    sequences: int
    seconds: float
    prompt: bool = False  # it read text without scoring it: a prompt, or a draft catching up
    hidden: bool = False  # a draft call made during a target call: its seconds were not the round's


@dataclass
class RoundReport:
    """What the loop tells the policy after a round."""

    sources: list[Source]  # source of each drafted position
    confidences: list[float | None]  # draft confidence per position (None: no distribution)
    num_accepted: int
    emitted_tokens: tuple[int, ...]
    # [emitted, vocab] or more rows: the target's distributions at the round's positions;
    # row j follows the text emitted before it (so it exists for every emitted token).
    target_probs: object = None
    # The round's calls by its own clock (meaningful alone; in a batch the scheduler
    # times the shared calls), and its wall time.
    target_tokens: int = 0  # tokens the verify call scored for this sequence (0: no call)
    target_seconds: float = 0.0
    draft_calls: list[DraftCall] = field(default_factory=list)
    round_seconds: float = 0.0


class Policy(Protocol):
    """A draft-length policy: FixedK below, or a seat of control.Planner (-k auto).
    Those that subclass it inherit begin, observe and end that do nothing."""

    k_max: int

    def begin(self, context: list[int], max_new_tokens: int) -> None:
        """A new sequence starts after `context`."""
        ...

    def plan(self, offer: Offer) -> Plan: ...

    def observe(self, report: RoundReport) -> None: ...

    def ahead(self, drafted: int, call_tokens: int) -> int:
        """Drafts to make for the next round during this round's target call of
        `call_tokens` tokens, after `drafted` model drafts (decoding/overlap.py); known
        before anything of this round is verified. By default as many as this round's."""
        return drafted

    def end(self) -> None:
        """The sequence begun last is over (finished, stopped or abandoned)."""
        ...

    def fork(self) -> Policy:
        """The policy of another sequence decoded beside this one (control.py says
        what they share)."""
        ...


class Seated(Policy):
    """A policy whose rounds one planner decides together with other sequences' (a
    seat of control.Planner). Played as it is, it is a batch of one: it asks its
    planner for its own plan and records its round's calls. In a scheduler
    (batching.Scheduled) the scheduler asks the planner with every sequence's offers
    and records each shared call once, and the seat only learns from its reports.
    What the scheduler needs of it:"""

    planner: object  # decide(offers, load) -> {seat: Plan}; record(ModelCall, ended)

    def start(self, max_new_tokens: int) -> None:
        """begin() without opening its planner's round window (the scheduler's calls close it)."""
        ...

    def offered(self, offer: Offer) -> Plan | None:
        """Its plan when the offer needs none from the planner (a free first token); else None."""
        ...

    def learn(self, report: RoundReport) -> None:
        """observe() without recording the round's calls (the scheduler recorded them)."""
        ...


class FixedK(Policy):
    """Always K drafts (fewer when the budget or the lookup is shorter). A lookup match
    is preferred to the draft model: the hybrid drafter's fixed-K behaviour."""

    def __init__(self, k: int):
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}")
        self.k_max = k

    def plan(self, offer: Offer) -> Plan:
        for source, available in sorted(offer.available.items(), key=lambda kv: kv[0] == MODEL):
            if available > 0:
                return Plan(source, min(self.k_max, available), limit=available)
        return NO_DRAFTS

    def fork(self) -> FixedK:
        return FixedK(self.k_max)


def check_fixed_k(k) -> None:
    """The one rule for a fixed K: -k on the command line (policy/make.py) and the
    integer stream() takes for FixedK(K)."""
    if not (isinstance(k, int) and not isinstance(k, bool) and k >= 1):
        raise ValueError(f"k must be 'auto' or an integer >= 1, got {k!r}")


def ready_policy(policy: Policy | int | None, drafts: bool) -> Policy | None:
    """The policy a loop plays: `policy` itself, or FixedK(K) for an integer K; None
    only where nothing drafts. The loop never makes a planner: one whose prices come
    from timing the models is made by whoever knows them (policy/make.py's
    make_policy, which assembly, the server and the bench call)."""
    if policy is None:
        if drafts:
            raise ValueError("a drafter needs a policy: K, or one that policy.make.make_policy made")
        return None
    if policy == "auto":
        raise ValueError("'auto' is a planner that times the models first: make it with policy.make.make_policy "
                         "(or assembly's Models.policy) and pass it")
    if isinstance(policy, (int, str)):
        check_fixed_k(policy)
        return FixedK(policy)
    return policy
