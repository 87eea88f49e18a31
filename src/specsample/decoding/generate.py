"""The generation loop: autoregressive (no drafter) and speculative sampling."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from .admission import Admission
from ..backends.base import Backend, check_cache, check_same_vocabulary, claim_cache, common_prefix_length
from ..output.constraints import Constraint
from ..output.constraints import start as start_grammar
from .batching import PREFILL_CHUNK, BatchStats, Scheduler, scheduled, slots
from .context_fit import new_token_room
from ..output.detokenize import TextTracker
from ..output.text_stops import TextStop
from .drafters import Drafter, finish, reuse_model_cache, tell
from ..output.logprobs import MAX_TOP, MODES, TokenLogprob, token_logprobs
from .overlap import Overlap, stream_overlaps
from .plans import Policy, ready_policy
from .rounds import IN_ROUND, Round, play_round
from .sampling import InvalidSetting, Sampler, SamplingConfig

VERIFIERS = ("auto", "block", "rejection", "coupled")


@dataclass
class GenerationStats:
    new_tokens: int = 0
    target_calls: int = 0  # decoding calls; the prompt prefill is not counted
    draft_calls: int = 0
    drafted: int = 0
    accepted: int = 0
    accepted_histogram: list[int] = field(default_factory=list)  # rounds by accepted count
    draft_length_histogram: list[int] = field(default_factory=list)  # rounds by drafts proposed; [0]: plain steps
    sources: dict[str, list[int]] = field(default_factory=dict)  # str(source) -> [rounds, drafted, accepted]
    forced_tokens: int = 0  # emitted tokens a grammar forced (in any mode; drafted for free with a drafter)
    predrafted_rounds: int = 0  # rounds whose drafts were made during the previous round's target call (overlap.py)
    cached_prompt_tokens: int = 0  # of the prompt, held in the target's cache already (cache_prompt): not scored
    prefill_seconds: float = 0.0
    first_token_seconds: float | None = None  # from the call to the first emitted token (None: none emitted)
    draft_seconds: float = 0.0
    target_seconds: float = 0.0
    constraint_seconds: float = 0.0  # in the grammar engine (masks, forced tokens); part of draft and other time
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

    @property
    def plain_rounds(self) -> int:
        return self.draft_length_histogram[0] if self.draft_length_histogram else 0

    def record_round(self, draft, num_accepted: int, emitted: int, cut: bool) -> None:
        """Count only drafts inside the emitted text: after an EOS, a stop string or
        the token budget (`cut`) the rest of an accepted block was never used."""
        m = len(draft)
        counted = min(m, emitted) if cut else m
        accepted = min(num_accepted, counted)
        _bump(self.draft_length_histogram, m)
        if m:
            self.drafted += counted
            self.accepted += accepted
            _bump(self.accepted_histogram, num_accepted)
            for source in dict.fromkeys(draft.sources):  # a round may mix forced tokens and another source
                rounds, drafted, acc = self.sources.get(str(source), [0, 0, 0])
                self.sources[str(source)] = [rounds + 1, drafted + draft.sources[:counted].count(source),
                                             acc + draft.sources[:accepted].count(source)]

    def as_dict(self) -> dict:
        return {
            "new_tokens": self.new_tokens,
            "target_calls": self.target_calls,
            "draft_calls": self.draft_calls,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "accepted_histogram": list(self.accepted_histogram),
            "draft_length_histogram": list(self.draft_length_histogram),
            "plain_rounds": self.plain_rounds,
            "sources": {k: dict(zip(("rounds", "drafted", "accepted"), v)) for k, v in self.sources.items()},
            "forced_tokens": self.forced_tokens,
            "predrafted_rounds": self.predrafted_rounds,
            "cached_prompt_tokens": self.cached_prompt_tokens,
            "acceptance_rate": self.acceptance_rate,
            "mean_tokens_per_target_call": self.mean_tokens_per_target_call,
            "tokens_per_second": self.tokens_per_second,
            "prefill_seconds": self.prefill_seconds,
            "first_token_seconds": self.first_token_seconds,
            "draft_seconds": self.draft_seconds,
            "target_seconds": self.target_seconds,
            "constraint_seconds": self.constraint_seconds,
            "other_seconds": self.other_seconds,
            "total_seconds": self.total_seconds,
        }


@dataclass
class GenerationConfig:
    max_new_tokens: int = 128  # the draft length is the policy's, passed beside the config (stream)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    seed: int | None = 0
    stop_strings: tuple[str, ...] = ()
    text_stops: tuple[TextStop, ...] = ()  # rules that end the text (text_stops.py: an editor's n_indent, ...)
    eos_token_ids: frozenset[int] | None = None  # None: the target's own
    # "block": block verification (verify_block), which keeps on average at least as
    # many drafts as "rejection", token-by-token modified rejection sampling (verify);
    # "coupled": Gumbel-max coupling keyed by (seed, position) (verify_coupled), whose
    # tokens depend only on the target, the seed and the position, never on the
    # drafter, K or timing; "auto": coupled when a seed is given, block otherwise.
    verifier: str = "auto"
    logprobs: int | None = None  # None: none; N: each emitted token's and the N likeliest alternatives'
    logprobs_mode: str = "raw"  # "raw" (the model's) or "processed" (after the controls); see logprobs.py
    constraint: Constraint | None = None  # a JSON schema, regex or grammar the output must match
    # Score only the part of the prompt the target's cache does not hold already: the
    # start it shares with the text the last generation on this backend (or slot) left
    # there (Backend.cached_tokens), as llama-server's cache_prompt. Off by default: with
    # kernels whose numbers move with a call's size (llama.cpp's defaults) the reused
    # rows were computed in other calls than a fresh prefill's, so the logits can differ
    # in their last bits from the same request's alone; with --batch-invariant they do not.
    cache_prompt: bool = False

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if "" in self.stop_strings:  # it would match before the first token
            raise ValueError("stop strings must not be empty")
        if self.verifier not in VERIFIERS:
            raise ValueError(f"verifier must be one of {', '.join(VERIFIERS)}, got {self.verifier!r}")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP:
            raise InvalidSetting("logprobs", f"must be in [0, {MAX_TOP}]", self.logprobs)
        if self.seed is not None and not -(1 << 63) <= self.seed < 1 << 64:  # what torch's manual_seed takes
            raise InvalidSetting("seed", f"must be in [{-(1 << 63)}, {(1 << 64) - 1}]", self.seed)
        if self.logprobs_mode not in MODES:
            raise ValueError(f"logprobs mode must be one of {', '.join(MODES)}, got {self.logprobs_mode!r}")

    @property
    def coupled(self) -> bool:
        """Whether the verifier couples drafts and target by shared noise. Greedy rows
        are one-hot: both verifiers accept exactly the drafts that equal the argmax, so
        coupling would only cost its noise."""
        if self.sampling.greedy:
            return False
        return self.verifier == "coupled" or self.verifier == "auto" and self.seed is not None

    @property
    def block(self) -> bool:
        """Whether drafts are verified as a block (verify_block). Greedy rows are
        one-hot: block verification then keeps exactly the drafts that equal the argmax,
        as token by token does, which needs no residual over the vocabulary."""
        return not self.sampling.greedy and not self.coupled and self.verifier in ("auto", "block")


@dataclass
class Chunk:
    token_ids: list[int]  # tokens emitted by one round
    text: str  # text they complete (may lag a token behind on split characters)
    logprobs: list[TokenLogprob] | None = None  # one per token, when the config asks for them


@dataclass
class GenerationResult:
    token_ids: list[int]
    text: str
    stats: GenerationStats
    # "length", "eos", "stop_string", "grammar" (the constrained output is complete) or
    # "limit" (a text rule ended it: config.text_stops)
    stop_reason: str
    logprobs: list[TokenLogprob] | None = None  # one per token, when the config asks for them


class Stream:
    """Iterate for chunks as rounds accept them; `result` once exhausted."""

    def __init__(self, rounds: Iterator[Chunk]):
        self._rounds = rounds
        self.result: GenerationResult | None = None

    def __iter__(self) -> Iterator[Chunk]:
        self.result = yield from self._rounds


def check_prompt(prompt: str | list[int]) -> None:
    """The one rule for an empty prompt: no token ids, or text with nothing but
    whitespace. stream() applies it to ids; the command line to the text, before the
    models load."""
    if not (prompt.strip() if isinstance(prompt, str) else prompt):
        raise ValueError("the prompt is empty")


def stream(
    target: Backend,
    prompt_ids: list[int],
    config: GenerationConfig,
    drafter: Drafter | None = None,
    policy: Policy | int | None = None,
    clock=time.perf_counter,
    overlap: bool = False,
) -> Stream:
    """Generation as an iterator of chunks. `policy` alone decides each round's drafts:
    a ready Policy, or K for a fixed K (plans.ready_policy); a planner (-k auto) is made
    and timed by whoever knows the models (policy/make.py), never here, and one
    planner's seat keeps its measurements across calls. Without a drafter it is not
    needed. `clock` times the rounds. `overlap`: the pair's placement, decided where
    both models are known (assemble's Models.overlap): target and draft compute apart,
    so the draft model drafts during the target's calls (overlap.py)."""
    check_prompt(prompt_ids)
    config.sampling.check_vocabulary(target.vocab_size)
    draft_backend = None if drafter is None else drafter.model_backend
    if draft_backend is target:  # both would write one cache: each would score on the other's tokens
        raise ValueError(
            f"the drafter runs on the target's own backend object ({target.name}); load the draft model as a "
            f"backend of its own (the same model files will do) or draft by n-gram lookup"
        )
    if draft_backend is not None:
        check_same_vocabulary(target, draft_backend)  # assemble() checked its own pair; a library caller's here
    for backend in (target, draft_backend) if drafter is not None else ():
        # Refuse now, before any text is streamed (or a call timed), rather than at the first rejection.
        if backend is not None and not backend.supports_rollback:
            raise ValueError(f"{backend.name} keeps recurrent state that cannot be rolled back, so it cannot take part "
                             "in speculative decoding; run it autoregressively")
    policy = ready_policy(policy, drafts=drafter is not None)
    k_max = 0 if policy is None else policy.k_max  # without a drafter a round adds no drafts
    for role, backend in (("target", target), ("draft", draft_backend)):
        if backend is None:
            continue
        # Every model in the round holds the text so far plus drafts; a draft loaded
        # with a shorter context than its target's fails first.
        if config.max_new_tokens > new_token_room(backend.context_length, len(prompt_ids), k_max):
            raise ValueError(
                f"prompt of {len(prompt_ids)} tokens plus {config.max_new_tokens} new tokens and "
                f"{k_max + 1} for drafts does not fit the context of the {role} model "
                f"{backend.name}: {backend.context_length} tokens"
            )
    grammar = None if config.constraint is None else start_grammar(config.constraint, target, config.max_new_tokens)
    return Stream(_rounds(target, prompt_ids, config, drafter, policy, clock, grammar, overlap))


def reusable_prefix(cached: list[int] | None, prompt_ids: list[int]) -> int:
    """How many of the prompt's first tokens a cache holding `cached` (None: unknown)
    already has: their common start, less the prompt's last token, which is scored
    again for the distribution of the first new one."""
    return min(common_prefix_length(cached, prompt_ids), len(prompt_ids) - 1) if cached else 0


def generate(target, prompt_ids, config, drafter=None, policy=None, clock=time.perf_counter,
             overlap: bool = False) -> GenerationResult:
    s = stream(target, prompt_ids, config, drafter, policy, clock, overlap)
    for _ in s:
        pass
    return s.result


def _prefill(target, prompt_ids, config, drafter, grammar, sampler,
             overlaps: bool) -> tuple[int, Overlap | None, torch.Tensor]:
    """The prompt's prefill, from the longest prefix the target's cache holds (where
    the config caches prompts): the tokens reused, the stream's Overlap where the
    pair is placed apart (the draft then reads the prompt during the prefill and
    drafts each next block during a call: overlap.py), and the last row ([1, vocab])."""
    reused = reusable_prefix(target.cached_tokens(), prompt_ids) if config.cache_prompt else 0
    target.rollback(reused)
    if config.cache_prompt:
        reuse_model_cache(drafter)
    overlap = Overlap() if stream_overlaps(overlaps, drafter, grammar) else None
    if overlap is None:
        return reused, None, target.score(prompt_ids[reused:], num_logits=1)
    return reused, overlap, overlap.prefill(target, drafter, prompt_ids, reused, sampler)


def _rounds(target, prompt_ids, config, drafter, policy, clock, grammar, overlaps) -> Iterator[Chunk]:
    generator = torch.Generator().manual_seed(config.seed) if config.seed is not None else None
    coupled_seed = None
    if config.coupled:  # unseeded coupling still needs one seed for its noise
        coupled_seed = config.seed if config.seed is not None else int(torch.randint(1 << 62, ()))
    sampler = Sampler(len(prompt_ids), generator, coupled_seed, block=config.block)
    out = Emitter(target, prompt_ids, config, grammar, GenerationStats())
    start = clock()

    # Prefill the prompt. Its last row is the distribution of the first new token, so
    # the first round feeds only its drafts (none, under -k auto: control.py) and
    # every later round feeds the last emitted token ("pending", never scored yet)
    # plus the drafts. Either way a round gets one distribution per draft plus one.
    claim = claim_cache(target)
    reused, overlap, carried = _prefill(target, prompt_ids, config, drafter, grammar, sampler, overlaps)
    out.stats.cached_prompt_tokens = reused
    out.stats.prefill_seconds = clock() - start
    if drafter is not None:
        policy.begin(out.context, config.max_new_tokens)
    calls = IN_ROUND if overlap is None else overlap  # how each round calls the target (rounds.TargetCalls)
    try:
        while out.going:
            # The target must still hold this stream's text (all but the pending token):
            # another stream on the same backend may have run in between.
            check_cache(target, claim, len(out.context) - (carried is None))
            played = play_round(target, drafter, policy, sampler, config.sampling, grammar, out.context, carried,
                                out.room, clock, calls)
            carried = played.carry  # the row a kept block starts from (overlap.py); else None
            chunk = out.emit(played)
            if chunk.token_ids and out.stats.first_token_seconds is None:
                out.stats.first_token_seconds = clock() - start  # what a user waits for
            # Tell the drafter how its drafts fared, and the policy what the round cost.
            if drafter is not None:
                tell(drafter, played.draft, played.verdict.num_accepted)
                policy.observe(played.report(chunk.token_ids, clock() - played.started))
            out.stats.total_seconds = clock() - start
            yield chunk
        yield from out.flush()
    finally:  # also when the stream is abandoned (closed, or collected) before its end
        if drafter is not None:
            policy.end()
            finish(drafter, out.context)  # a suffix drafter keeps the text for later requests
        if overlap is not None:
            overlap.close()
    out.stats.total_seconds = clock() - start
    return out.result()


class Emitter:
    """Places each round's tokens in one sequence's output: stops at EOS, the token
    budget, a stop string or the end of the grammar (which moves on with every
    emitted token), and counts log-probabilities and statistics."""

    def __init__(self, target, prompt_ids, config: GenerationConfig, grammar, stats: GenerationStats):
        self.config, self.grammar, self.stats = config, grammar, stats
        self.eos = target.eos_token_ids if config.eos_token_ids is None else config.eos_token_ids
        self.context = list(prompt_ids)
        self.new: list[int] = []
        self.text = TextTracker(target.tokenizer, config.stop_strings, config.text_stops)
        self.logprobs: list[TokenLogprob] | None = None if config.logprobs is None else []
        self.stop_reason = "grammar" if grammar is not None and grammar.done else "length"

    @property
    def room(self) -> int:  # tokens the budget still allows
        return self.config.max_new_tokens - len(self.new)

    @property
    def going(self) -> bool:
        return self.stop_reason == "length" and self.room > 0

    def emit(self, played: Round) -> Chunk:
        stats, grammar, verdict = self.stats, self.grammar, played.verdict
        stats.draft_calls += played.draft_calls
        stats.draft_seconds += played.draft_seconds
        stats.target_calls += bool(played.fed)
        stats.target_seconds += played.target_seconds - played.hidden_seconds  # what the stream waited for it
        stats.predrafted_rounds += played.predrafted
        emitted = []
        for token in verdict.tokens[: self.room]:
            emitted.append(token)
            if grammar is not None:
                stats.forced_tokens += grammar.advance(token)  # refuses a token the grammar forbids
            if token in self.eos:
                self.stop_reason = "eos"
                break
            if self.text.add(token):
                self.stop_reason = self.text.stopped_by
                break
            if grammar is not None and grammar.done:
                self.stop_reason = "grammar"
                break
        self.new += emitted
        self.context += emitted
        # Emitted token i was chosen from row i: its log-probability costs no model call.
        scored = None
        if self.logprobs is not None:
            scored = token_logprobs(played.logits, played.target_probs, emitted, self.config.logprobs,
                                    self.config.logprobs_mode)
            self.logprobs += scored
        stats.record_round(played.draft, verdict.num_accepted, len(emitted), cut=len(emitted) < len(verdict.tokens))
        stats.new_tokens = len(self.new)
        stats.constraint_seconds = 0.0 if grammar is None else grammar.seconds
        return Chunk(emitted, self.text.take(), scored)

    def flush(self) -> Iterator[Chunk]:
        tail = self.text.flush()
        if tail:
            yield Chunk([], tail)

    def result(self) -> GenerationResult:
        return GenerationResult(self.new, self.text.final(), self.stats, self.stop_reason, self.logprobs)


def _bump(histogram: list[int], index: int) -> None:
    histogram.extend([0] * (index + 1 - len(histogram)))
    histogram[index] += 1


def generate_many(target, prompts: list[list[int]], configs, draft=None,
                  make_drafter: Callable[[Backend], object] | None = None, policy=None,
                  prefill_chunk: int = PREFILL_CHUNK, clock=time.perf_counter) -> tuple[list, BatchStats]:
    """Generate for every prompt, up to `target.sequences` at once: a prompt joins as
    soon as an earlier one finishes (continuous batching).

    `target` (and `draft`, when given) hold several sequences (a llama.cpp backend
    loaded with `sequences=N`, or SeparateSequences); `configs` is one
    GenerationConfig or one per prompt; `make_drafter(draft_slot)` builds a sequence's
    drafter on its slot of the draft model (the draft is None for lookup alone);
    `policy` (a ready one, or K: as stream's) is forked for each sequence (control.py:
    the seats of one planner; make it for `target.sequences` sequences, policy/make.py);
    `clock` times the calls. Returns the GenerationResults
    in the prompts' order, and the batch's statistics. A prompt that fails raises
    after the others are done.
    """
    configs = list(configs) if isinstance(configs, (list, tuple)) else [configs] * len(prompts)
    if len(configs) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(configs)} configurations")
    if draft is not None and draft.sequences < target.sequences:
        raise ValueError(f"the draft model holds {draft.sequences} sequences, the target {target.sequences}")
    policy = ready_policy(policy, drafts=make_drafter is not None)
    target_slots = slots(target)
    draft_slots = slots(draft) if draft is not None else [None] * len(target_slots)
    scheduler = Scheduler(target, prefill_chunk, clock)
    jobs = [None] * len(prompts)
    waiting = list(range(len(prompts)))

    def one(i: int, seq: int) -> GenerationResult:
        drafter = None if make_drafter is None else make_drafter(draft_slots[seq])
        return generate(target_slots[seq], prompts[i], configs[i], drafter, scheduled(policy and policy.fork()))

    def admit(admission: Admission) -> bool:
        # The prompts in order, each on the slot free longest, until every one has run.
        while waiting and admission.free:
            i = waiting.pop(0)
            jobs[i] = admission.start(admission.free[0], functools.partial(one, i))
        return scheduler.live > 0

    Admission(scheduler, len(target_slots)).run(admit)
    for j in jobs:
        if j.error is not None:
            raise j.error
    return [j.result for j in jobs], scheduler.stats
