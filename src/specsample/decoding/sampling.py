"""Sampling controls: logits -> the probabilities a token is actually drawn from.

Target and draft go through the same function, so the draft probabilities used in
the acceptance ratio are exactly the distribution each draft token was drawn from,
and greedy is a one-hot distribution rather than a softmax that was never sampled
from. The order is vLLM's: logit_bias, then the penalties, then (unless greedy)
temperature, min_p, top-k and top-p.

Penalties look back at the text before each row. Which tokens count follows vLLM
(and OpenAI's description of "the text so far" as the completion): presence and
frequency penalties count the *generated* tokens only; the repetition penalty
(Keskar et al. 2019, as in transformers and vLLM) counts the prompt's tokens too.
In a verify call row j follows the text plus drafts[:j], so the drafts before a row
count as generated tokens there: the row is the target's distribution given exactly
that prefix, as it would be had the drafts been sampled one step at a time.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

import torch


# Temperatures below this are greedy (vLLM's threshold too). There softmax(logits / T)
# keeps only e^-(gap / T) of the mass off the argmax: e^-100 for logits 1e-3 apart,
# which is the rounding noise of a float16 model's logits, so sampling differs from
# greedy only at exact ties (greedy takes the lowest id); while dividing by a smaller
# T overflows float32 (T = 1e-40: every logit inf, the softmax NaN).
MIN_TEMPERATURE = 1e-5


class InvalidSetting(ValueError):
    """A configuration field outside what it takes. `field` names it, so each caller
    can say it in its own spelling (the CLI's top-p, the server's top_p); str() is
    the CLI's."""

    def __init__(self, field: str, rule: str, value: object):
        self.field, self.rule, self.value = field, rule, value
        super().__init__(self.message(field.replace("_", "-")))

    def message(self, name: str) -> str:
        return f"{name} {self.rule}, got {self.value}"


def check_range(field: str, value: float, low: float, high: float, low_open: bool = False) -> None:
    """value in [low, high] (or (low, high]); NaN and infinities never are."""
    if not (low < value if low_open else low <= value) or not value <= high or not math.isfinite(value):
        raise InvalidSetting(field, f"must be in {'(' if low_open else '['}{low}, {high}]", value)


MAX_TOP_K = 1 << 31  # a C int, as every engine's top_k is


class ExtraStep(Protocol):
    """A step of a named order that the sampler's core does not define: the editor's
    (output/infill_sampler.py, llama.cpp's infill sampler) plugs in here, so the core
    never knows it. `order` names it by `name`. It takes logits [n, vocab] float32, -inf
    where earlier steps removed a token, and returns them with -inf wherever it removes
    one. A step whose work grows with its candidates sets max_candidates: it then needs a
    top_k of 1 to that many earlier in the order."""

    name: ClassVar[str]
    max_candidates: ClassVar[int | None]

    def __call__(self, logits: torch.Tensor) -> torch.Tensor: ...


def bias_entry(token: int | str, bias: float, vocab_size: int | None = None) -> tuple[int, float]:
    """One logit_bias entry, checked: a token id (an int, or a string of ASCII digits:
    str.isdigit also takes other scripts' digits, int() too) in [0, vocab_size), and a
    bias in [-100, 100]. Without vocab_size only the lower end of the id is known."""
    if isinstance(token, str) and token.isascii() and token.isdigit():
        token = int(token)
    valid = isinstance(token, int) and not isinstance(token, bool) and token >= 0
    if valid and vocab_size is not None:
        valid = token < vocab_size
    if not valid or not -100 <= bias <= 100:  # NaN fails the comparison
        ids = "token ids >= 0" if vocab_size is None else f"token ids in [0, {vocab_size})"
        raise InvalidSetting("logit_bias", f"maps {ids} to biases in [-100, 100]", f"{token!r}: {bias}")
    return token, float(bias)


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 1.0  # 0, or anything below MIN_TEMPERATURE, means greedy (argmax)
    top_k: int = 0  # 0 disables
    top_p: float = 1.0  # 1.0 disables
    min_p: float = 0.0  # drop tokens below min_p x the top token's probability; 0 disables
    presence_penalty: float = 0.0  # subtracted once from every token generated so far
    frequency_penalty: float = 0.0  # subtracted per occurrence among the generated tokens
    repetition_penalty: float = 1.0  # divides (or, below 0, multiplies) logits of prompt and generated tokens
    # (token id, bias) pairs added to the logits; a dict is accepted and stored sorted
    logit_bias: tuple[tuple[int, float], ...] = field(default=())
    # None: the order above. Else the steps of STEPS to take, in this order; a control
    # left out must be at its neutral value (llama.cpp's samplers list turns it off).
    order: tuple[str, ...] | None = None
    extra_step: ExtraStep | None = field(default=None, compare=False)  # a step from outside the core, in order

    def __post_init__(self) -> None:
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise InvalidSetting("temperature", "must be a finite number >= 0", self.temperature)
        if not 0 <= self.top_k < MAX_TOP_K:
            raise InvalidSetting("top_k", f"must be in [0, {MAX_TOP_K})", self.top_k)
        check_range("top_p", self.top_p, 0, 1, low_open=True)
        check_range("min_p", self.min_p, 0, 1)
        check_range("presence_penalty", self.presence_penalty, -2, 2)  # OpenAI's range
        check_range("frequency_penalty", self.frequency_penalty, -2, 2)
        check_range("repetition_penalty", self.repetition_penalty, 0, 10, low_open=True)
        bias = self.logit_bias.items() if isinstance(self.logit_bias, dict) else self.logit_bias
        object.__setattr__(self, "logit_bias", tuple(sorted(bias_entry(t, b) for t, b in bias)))
        if self.order is not None:
            self._check_order()

    def _check_order(self) -> None:
        order = tuple(self.order)
        object.__setattr__(self, "order", order)
        extra = self.extra_step
        known = STEPS + ((extra.name,) if extra is not None else ())
        unknown = [s for s in order if s not in known]
        if unknown or len(set(order)) < len(order):
            raise InvalidSetting("samplers", f"takes each of {', '.join(known)} at most once", list(order))
        off = [s for s, (name, neutral) in STEP_OFF.items() if getattr(self, name) != neutral and s not in order]
        if off:
            raise InvalidSetting("samplers", f"leaves out {', '.join(off)}, which is set", list(order))
        if extra is not None:
            self._check_extra_step(order, extra)

    def _check_extra_step(self, order: tuple[str, ...], extra: ExtraStep) -> None:
        if extra.name not in order:
            raise ValueError(f"the {extra.name} step (SamplingConfig.extra_step) is not in the order {list(order)}")
        limit = extra.max_candidates
        if limit is not None:
            before = order[: order.index(extra.name)]
            if "top_k" not in before or not 1 <= self.top_k <= limit:
                raise InvalidSetting("samplers", f"puts {extra.name} after a top_k of 1 to {limit} (its work grows "
                                     "with the tokens before it)", list(order))

    def check_vocabulary(self, vocab_size: int) -> None:
        """logit_bias ids past the vocabulary are refused, on the CLI as on the server,
        rather than dropped: a bias that silently does nothing is a wrong answer."""
        for token, bias in self.logit_bias:
            bias_entry(token, bias, vocab_size)

    @property
    def greedy(self) -> bool:
        return self.temperature < MIN_TEMPERATURE

    @property
    def penalised(self) -> bool:
        """Whether the rows depend on the text before them."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0)


@dataclass(frozen=True)
class History:
    """The text before a block of rows: row i of n follows tokens[:len(tokens) - n + 1 + i]
    (the convention of Backend.score); the first prompt_length tokens are the prompt."""

    tokens: Sequence[int]
    prompt_length: int


def logits_to_probs(logits: torch.Tensor, config: SamplingConfig, history: History | None = None) -> torch.Tensor:
    """Probabilities after the sampling controls, always in float32.

    logits: [n, vocab] (any float dtype) -> [n, vocab] float32, rows sum to 1.
    history: the text before the rows; needed only with penalties.
    """
    logits = process_logits(logits, config, history)
    if config.order is not None:
        extra = config.extra_step
        for step in config.order:
            logits = extra(logits) if extra is not None and step == extra.name else _STEP[step](logits, config)
        return torch.softmax(logits, dim=-1)
    if config.greedy:
        # Ties resolve to the lowest token id, as torch.argmax does in plain greedy.
        probs = torch.zeros_like(logits)
        probs.scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
        return probs
    if config.temperature != 1.0:  # dividing by 1 changes nothing and costs a copy a row block
        logits = logits / config.temperature
    logits = _min_p(logits, config)
    logits = _top_k(logits, config)
    probs = torch.softmax(logits, dim=-1)
    if config.top_p < 1.0:
        probs = _top_p_filter(probs, config.top_p)
    return probs


def _temperature(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    if config.greedy:  # the argmax alone (lowest id at ties), as a one-hot row after the softmax
        keep = logits.argmax(-1, keepdim=True)
        return torch.full_like(logits, float("-inf")).scatter_(-1, keep, logits.gather(-1, keep))
    return logits / config.temperature


def _min_p(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    if config.min_p <= 0:  # p_i < min_p * p_max  <=>  logit_i < logit_max + log(min_p)
        return logits
    floor = logits.amax(-1, keepdim=True) + math.log(config.min_p)
    return logits.masked_fill(logits < floor, float("-inf"))


def _top_k(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    if not 0 < config.top_k < logits.shape[-1]:
        return logits
    kth = torch.topk(logits, config.top_k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def _top_p(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    if config.top_p >= 1.0:
        return logits
    kept = _top_p_filter(torch.softmax(logits, dim=-1), config.top_p)
    return logits.masked_fill(kept == 0, float("-inf"))


# Each step's field and the value that turns it off: a step an order leaves out must be off.
STEP_OFF = {"temperature": ("temperature", 1.0), "min_p": ("min_p", 0.0), "top_k": ("top_k", 0), "top_p": ("top_p", 1.0)}
# The core's steps a config's order may name, by llama.cpp's names for its samplers (and
# the config's extra_step, by its own name).
_STEP = {"temperature": _temperature, "min_p": _min_p, "top_k": _top_k, "top_p": _top_p}
STEPS = tuple(_STEP)


def process_logits(logits: torch.Tensor, config: SamplingConfig, history: History | None = None) -> torch.Tensor:
    """The controls that come before temperature: logit_bias, then the penalties.

    logits: [n, vocab] -> [n, vocab] float32 (a copy when anything changes).
    """
    logits = logits.float()
    if config.logit_bias:
        config.check_vocabulary(logits.shape[-1])
        tokens = torch.tensor([t for t, _ in config.logit_bias], dtype=torch.long)
        bias = torch.tensor([b for _, b in config.logit_bias])
        logits = logits.index_add(-1, tokens, bias.expand(logits.shape[0], -1).contiguous())
    if config.penalised:
        if history is None:
            raise ValueError("penalties need the text before the rows (a History)")
        logits = _penalise(logits, config, history)
    return logits


def _penalise(logits: torch.Tensor, config: SamplingConfig, history: History) -> torch.Tensor:
    n, vocab = logits.shape
    first = len(history.tokens) - n + 1  # tokens before row 0
    if first < history.prompt_length:
        raise ValueError(f"{n} rows after {len(history.tokens)} tokens would start inside the prompt "
                         f"of {history.prompt_length}")
    tokens = torch.as_tensor(list(history.tokens), dtype=torch.long)  # [len]
    # counts[i]: occurrences of each token among the generated tokens before row i
    generated = torch.bincount(tokens[history.prompt_length : first], minlength=vocab)[:vocab]  # [vocab]
    later = torch.nn.functional.one_hot(tokens[first:], vocab).cumsum(0) if n > 1 else tokens.new_zeros(0, vocab)
    counts = torch.cat([generated[None], generated[None] + later]).float()  # [n, vocab]
    if config.repetition_penalty != 1.0:
        seen = counts > 0
        seen[:, tokens[: history.prompt_length]] = True
        penalised = torch.where(logits > 0, logits / config.repetition_penalty, logits * config.repetition_penalty)
        logits = torch.where(seen, penalised, logits)
    if config.frequency_penalty:
        logits = logits - config.frequency_penalty * counts
    if config.presence_penalty:
        logits = logits - config.presence_penalty * (counts > 0).float()
    return logits


def _top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    # Keep the smallest prefix of tokens (by descending probability) whose mass
    # reaches top_p; the token that crosses the threshold is kept. A full sort of a
    # large vocabulary per row is slow beside the rest of sampling, and top_p's mass
    # usually sits in a few tokens, so look at the top 256 first and widen only when
    # they hold less than top_p (with a margin, so that rounding cannot decide whether
    # the next token would have been kept).
    vocab = probs.shape[-1]
    k = min(vocab, 256)
    while True:
        top, index = probs.topk(k, dim=-1)  # [n, k], descending
        mass = top.cumsum(-1)  # [n, k]
        if k == vocab or bool((mass[:, -1] > top_p + 1e-6).all()):
            break
        k = min(vocab, k * 8)
    top = top.masked_fill(mass - top >= top_p, 0.0)
    filtered = torch.zeros_like(probs).scatter_(-1, index, top)
    return filtered / filtered.sum(-1, keepdim=True)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token id per row, by inverting the cumulative distribution.

    probs: [n, vocab] -> [n] int64. A float64 cumsum and a binary search instead of
    torch.multinomial, which is several times slower per row over a large vocabulary.
    float64 keeps the rounding error of the running sum (~1e-11 over 152k terms) far
    below anything a test could see.
    Zero-probability tokens are never chosen: their cumulative value equals the one
    before them, and the search returns the first index whose value exceeds u.
    """
    top, index = probs.max(-1)  # [n], [n]
    if all(p >= 1.0 for p in top.tolist()):  # one-hot rows (greedy): nothing to draw
        return index
    cdf = probs.cumsum(-1, dtype=torch.float64)  # [n, vocab]: each float32 term summed in float64
    u = torch.rand(probs.shape[0], 1, generator=generator, dtype=torch.float64).mul_(cdf[:, -1:])  # [n, 1]
    return torch.searchsorted(cdf, u, right=True).squeeze_(-1).clamp_max_(probs.shape[-1] - 1)


# ---- drawing: from a generator, or coupled by noise keyed to the position ----------


def race_noise(seed: int, position: int, vocab: int) -> torch.Tensor:
    """Exponential noise E [vocab] float64 for one position of one seeded generation.

    argmax(probs / E) is a draw from probs (exponential races: token i's clock rings
    at E_i / p_i, and the first of independent clocks with rates p_i is i with
    probability p_i; the same as Gumbel-max, argmax(log p + g) with g = -log E). The
    noise depends on (seed, position) alone, so every row scored for a position, by
    the target or a draft, in any round, sees the same E.
    """
    key = int.from_bytes(hashlib.blake2b(f"{seed}:{position}".encode(), digest_size=8).digest(), "little")
    u = torch.rand(vocab, generator=torch.Generator().manual_seed(key), dtype=torch.float64)  # [0, 1)
    return -torch.log(u)  # > 0; u = 0 gives inf, a token that cannot win


def coupled_choice(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """probs [n, vocab], noise [n, vocab] -> [n] int64: argmax(probs / noise) per row.
    Tokens of probability 0 score 0 and never beat one that has mass."""
    return (probs.double() / noise).argmax(-1)


class Sampler:
    """How one generation draws its tokens, shared by the loop and the drafter.

    Rows become probabilities by logits_to_probs, with the history the penalties need
    (the prompt's length tells generated tokens from prompt tokens). Tokens are drawn
    from the generator, or, when coupled_seed is set, by coupled_choice with noise
    keyed by (coupled_seed, absolute position): a seeded answer is then a function of
    the target's distributions and the seed alone (verify.verify_coupled). Drafts
    drawn from the generator are verified as a block when `block` is set
    (verify.verify_block), else token by token (verify.verify).
    """

    def __init__(self, prompt_length: int = 0, generator: torch.Generator | None = None,
                 coupled_seed: int | None = None, block: bool = False):
        self.prompt_length = prompt_length
        self.generator = generator
        self.coupled_seed = coupled_seed
        self.block = block and coupled_seed is None
        self._noise: dict[int, torch.Tensor] = {}  # position -> [vocab]; the draft and the target share it

    @property
    def coupled(self) -> bool:
        return self.coupled_seed is not None

    def probs(self, logits: torch.Tensor, tokens: Sequence[int], config: SamplingConfig) -> torch.Tensor:
        """logits [n, vocab] -> [n, vocab]; row i follows tokens[:len(tokens) - n + 1 + i]."""
        history = History(tokens, self.prompt_length) if config.penalised else None
        return logits_to_probs(logits, config, history)

    def draw(self, probs: torch.Tensor, position: int) -> torch.Tensor:
        """probs [n, vocab] -> [n] int64; row i draws the token at position + i."""
        if not self.coupled:
            return sample(probs, self.generator)
        return coupled_choice(probs, self.noise(position, probs.shape[0], probs.shape[-1]))

    def noise(self, position: int, n: int, vocab: int) -> torch.Tensor:
        """[n, vocab]: race_noise for positions position .. position + n - 1."""
        for p in [p for p in self._noise if p < position]:  # positions behind us never come back
            del self._noise[p]
        rows = []
        for p in range(position, position + n):
            if p not in self._noise:
                self._noise[p] = race_noise(self.coupled_seed, p, vocab)
            rows.append(self._noise[p])
        return torch.stack(rows)
