"""The generation loop: autoregressive (no drafter) and speculative sampling."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from .backends.base import Backend, check_same_vocabulary
from .drafters import Drafter, ModelDrafter
from .sampling import SamplingConfig, logits_to_probs
from .verify import verify


@dataclass
class GenerationStats:
    new_tokens: int = 0
    target_calls: int = 0  # decoding calls; the prompt prefill is not counted
    draft_calls: int = 0
    drafted: int = 0
    accepted: int = 0
    accepted_histogram: list[int] = field(default_factory=list)  # rounds by accepted count
    prefill_seconds: float = 0.0
    draft_seconds: float = 0.0
    target_seconds: float = 0.0
    total_seconds: float = 0.0

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def mean_tokens_per_target_call(self) -> float:
        return self.new_tokens / self.target_calls if self.target_calls else 0.0

    @property
    def tokens_per_second(self) -> float:
        # Wall time from the call to the last token, prompt prefill included.
        return self.new_tokens / self.total_seconds if self.total_seconds else 0.0

    @property
    def other_seconds(self) -> float:
        return self.total_seconds - self.prefill_seconds - self.draft_seconds - self.target_seconds

    def as_dict(self) -> dict:
        return {
            "new_tokens": self.new_tokens,
            "target_calls": self.target_calls,
            "draft_calls": self.draft_calls,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "accepted_histogram": list(self.accepted_histogram),
            "acceptance_rate": self.acceptance_rate,
            "mean_tokens_per_target_call": self.mean_tokens_per_target_call,
            "tokens_per_second": self.tokens_per_second,
            "prefill_seconds": self.prefill_seconds,
            "draft_seconds": self.draft_seconds,
            "target_seconds": self.target_seconds,
            "other_seconds": self.other_seconds,
            "total_seconds": self.total_seconds,
        }


@dataclass
class GenerationConfig:
    max_new_tokens: int = 128
    k: int = 4  # draft tokens per round; ignored without a drafter
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    seed: int | None = 0
    stop_strings: tuple[str, ...] = ()
    eos_token_ids: frozenset[int] | None = None  # None: the target's own

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max-new-tokens must be >= 1, got {self.max_new_tokens}")


@dataclass
class Chunk:
    token_ids: list[int]  # tokens emitted by one round
    text: str  # text they complete (may lag a token behind on split characters)


@dataclass
class GenerationResult:
    token_ids: list[int]
    text: str
    stats: GenerationStats
    stop_reason: str  # "length", "eos" or "stop_string"


class Stream:
    """Iterate for chunks as rounds accept them; `result` once exhausted."""

    def __init__(self, rounds: Iterator[Chunk]):
        self._rounds = rounds
        self.result: GenerationResult | None = None

    def __iter__(self) -> Iterator[Chunk]:
        self.result = yield from self._rounds


def stream(
    target: Backend,
    prompt_ids: list[int],
    config: GenerationConfig,
    drafter: Drafter | None = None,
) -> Stream:
    if not prompt_ids:
        raise ValueError("the prompt is empty")
    if len(prompt_ids) + config.max_new_tokens + config.k + 1 > target.context_length:
        raise ValueError(
            f"prompt of {len(prompt_ids)} tokens plus {config.max_new_tokens} new tokens "
            f"does not fit the model's context of {target.context_length}"
        )
    if isinstance(drafter, ModelDrafter):
        check_same_vocabulary(target, drafter.backend)
    return Stream(_rounds(target, prompt_ids, config, drafter))


def generate(target, prompt_ids, config, drafter=None) -> GenerationResult:
    s = stream(target, prompt_ids, config, drafter)
    for _ in s:
        pass
    return s.result


def _rounds(target, prompt_ids, config, drafter) -> Iterator[Chunk]:
    generator = torch.Generator().manual_seed(config.seed) if config.seed is not None else None
    eos = target.eos_token_ids if config.eos_token_ids is None else config.eos_token_ids
    stats = GenerationStats()
    k = config.k if drafter is not None else 0
    start = time.perf_counter()

    # Prefill all but the last prompt token: every round then feeds the last emitted
    # token ("pending") plus the drafts, and gets K+1 distributions back.
    target.rollback(0)
    if len(prompt_ids) > 1:
        target.score(prompt_ids[:-1], num_logits=1)
    stats.prefill_seconds = time.perf_counter() - start
    context = list(prompt_ids)
    new: list[int] = []
    text = _TextTracker(target.tokenizer, config.stop_strings)
    stop_reason = "length"

    while stop_reason == "length" and len(new) < config.max_new_tokens:
        # 1. Draft up to K tokens (never more than we could still emit).
        t0 = time.perf_counter()
        budget = min(k, config.max_new_tokens - len(new) - 1)
        if drafter is not None and budget > 0:
            calls_before = drafter.calls
            draft_tokens, draft_probs = drafter.propose(context, budget, generator)
            stats.draft_calls += drafter.calls - calls_before
        else:
            draft_tokens, draft_probs = torch.empty(0, dtype=torch.long), None
        t1 = time.perf_counter()
        stats.draft_seconds += t1 - t0

        # 2. Score pending token + drafts in one target call: K+1 distributions.
        base = target.length
        m = draft_tokens.shape[0]
        logits = target.score([context[-1]] + draft_tokens.tolist(), num_logits=m + 1)
        stats.target_calls += 1
        stats.target_seconds += time.perf_counter() - t1

        # 3. Accept a prefix of the drafts, then one recovered or bonus token.
        target_probs = logits_to_probs(logits, config.sampling)  # [m + 1, vocab]
        verdict = verify(draft_tokens, draft_probs, target_probs, generator)
        if m:
            stats.drafted += m
            stats.accepted += verdict.num_accepted
            _bump(stats.accepted_histogram, verdict.num_accepted)
        # Keep pending + accepted drafts; the new last token is fed next round.
        target.rollback(base + 1 + verdict.num_accepted)

        # 4. Emit, stopping at EOS, the token budget or a stop string.
        emitted = []
        for token in verdict.tokens[: config.max_new_tokens - len(new)]:
            emitted.append(token)
            if token in eos:
                stop_reason = "eos"
                break
            if text.add(token):
                stop_reason = "stop_string"
                break
        new += emitted
        context += emitted
        stats.new_tokens = len(new)
        stats.total_seconds = time.perf_counter() - start
        yield Chunk(emitted, text.take())

    tail = text.flush()
    if tail:
        yield Chunk([], tail)
    stats.total_seconds = time.perf_counter() - start
    return GenerationResult(new, text.final(), stats, stop_reason)


def _bump(histogram: list[int], index: int) -> None:
    histogram.extend([0] * (index + 1 - len(histogram)))
    histogram[index] += 1


class _TextTracker:
    """Incremental decoding of the new tokens, with stop strings."""

    def __init__(self, tokenizer, stop_strings: tuple[str, ...]):
        self.tokenizer = tokenizer
        self.stop_strings = stop_strings
        self.ids: list[int] = []
        self.sent = 0  # characters already yielded
        self.stopped_at: int | None = None

    def add(self, token: int) -> bool:
        """Append one token; True once a stop string has appeared."""
        self.ids.append(token)
        if self.tokenizer is None or not self.stop_strings:
            return False
        text = self.tokenizer.decode(self.ids)
        for stop in self.stop_strings:
            # Search only where a new match can start.
            at = text.find(stop, max(0, self.sent - len(stop) + 1))
            if at != -1 and (self.stopped_at is None or at < self.stopped_at):
                self.stopped_at = at
        return self.stopped_at is not None

    def take(self) -> str:
        """Text not yet handed out that can no longer change."""
        if self.tokenizer is None:
            return ""
        text = self.tokenizer.decode(self.ids)
        if self.stopped_at is not None:
            end = self.stopped_at
        else:
            # Hold back a trailing partial character, and any tail that could still
            # grow into a stop string.
            end = len(text.rstrip("\ufffd"))
            for stop in self.stop_strings:
                for j in range(len(stop) - 1, 0, -1):
                    if text[:end].endswith(stop[:j]):
                        end -= j
                        break
        end = max(end, self.sent)
        delta = text[self.sent : end]
        self.sent = end
        return delta

    def flush(self) -> str:
        """Whatever was held back, once no more tokens will come."""
        tail = self.final()[self.sent :]
        self.sent += len(tail)
        return tail

    def final(self) -> str:
        if self.tokenizer is None:
            return ""
        text = self.tokenizer.decode(self.ids)
        return text if self.stopped_at is None else text[: self.stopped_at]
