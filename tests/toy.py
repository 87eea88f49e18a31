"""Exact toy models: a fixed random trigram table, cheap enough to sample 20,000 times
and small enough to enumerate the exact distribution of the next few tokens."""

from __future__ import annotations

import dataclasses
import itertools
import math

import torch

from specsample.backends.base import Backend, SavedSequence
from specsample.decoding.generate import GenerationConfig, GenerationStats, generate
from specsample.decoding.sampling import Sampler, SamplingConfig, logits_to_probs


class TrigramBackend(Backend):
    """Next-token logits depend only on the last two tokens: table[prev2, prev1]."""

    def __init__(self, table: torch.Tensor, name: str = "trigram"):  # table: [V, V, V]
        self.table = table
        self.name = name
        self.vocab_size = table.shape[-1]
        self.eos_token_ids = frozenset()
        self.context_length = 10_000
        self.tokenizer = None
        self.tokens: list[int] = []

    @property
    def length(self) -> int:
        return len(self.tokens)

    def next_logits(self, context: list[int]) -> torch.Tensor:  # [V]
        prev2 = context[-2] if len(context) >= 2 else 0
        return self.table[prev2, context[-1]]

    def score(self, token_ids, num_logits):
        self.tokens += token_ids
        n = len(self.tokens)
        if not num_logits:
            return torch.empty(0, self.vocab_size)
        return torch.stack([self.next_logits(self.tokens[: n - i]) for i in reversed(range(num_logits))])

    def rollback(self, length):
        del self.tokens[length:]

    def cached_tokens(self):
        return list(self.tokens)

    # Its whole state is its tokens: a copy of them is a saved cache (the server's host
    # prompt cache), counted as 4 bytes a token.
    saves_sequences = True

    def save_sequence(self, seq=0):
        return SavedSequence(tuple(self.tokens), None, 4 * len(self.tokens))

    def restore_sequence(self, seq, saved, length):
        self.tokens = list(saved.tokens[:length])


class PoisonedBackend(TrigramBackend):
    """Logits that turn to `value` (NaN, inf) once the context reaches `after` tokens,
    as a float16 model's do when an activation overflows."""

    def __init__(self, table: torch.Tensor, value: float, after: int, name: str = "poisoned"):
        super().__init__(table, name=name)
        self.value, self.after = value, after

    def next_logits(self, context: list[int]) -> torch.Tensor:  # [V]
        logits = super().next_logits(context)
        if len(context) < self.after:
            return logits
        return torch.cat([torch.tensor([self.value]), logits[1:]])


class ScriptedBackend(TrigramBackend):
    """Greedy decoding after a prompt of `prompt_length` tokens reads out `script`."""

    def __init__(self, script: list[int], vocab_size: int, prompt_length: int, tokenizer=None):
        super().__init__(torch.zeros(1, 1, vocab_size), name="scripted")
        self.script, self.prompt_length, self.tokenizer = script, prompt_length, tokenizer

    def next_logits(self, context: list[int]) -> torch.Tensor:  # [V]
        logits = torch.zeros(self.vocab_size)
        logits[self.script[(len(context) - self.prompt_length) % len(self.script)]] = 10.0
        return logits


class ByteTokenizer:
    """Token i is byte i: a character of several bytes is whole only once all of its
    tokens are there. Counts the tokens it decodes, all calls together."""

    def __init__(self):
        self.decoded = 0

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def decode(self, token_ids: list[int]) -> str:
        self.decoded += len(token_ids)
        return bytes(token_ids).decode("utf-8", errors="replace")

    def chat_prompt(self, text: str) -> list[int]:
        return self.encode(text)


def random_table(vocab: int, seed: int, scale: float = 1.5) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(vocab, vocab, vocab, generator=g) * scale


def exact_distribution(
    backend: TrigramBackend, prompt: list[int], length: int, sampling: SamplingConfig
) -> dict[tuple[int, ...], float]:
    """P(next `length` tokens) under the sampling controls, by enumeration (the
    penalties see the prompt as the prompt and the rest as generated)."""
    out = {}
    vocab = backend.vocab_size
    rows = Sampler(prompt_length=len(prompt))
    for seq in itertools.product(range(vocab), repeat=length):
        context, p = list(prompt), 1.0
        for token in seq:
            p *= float(rows.probs(backend.next_logits(context)[None], context, sampling)[0, token])
            if p == 0.0:
                break
            context.append(token)
        if p > 0:
            out[seq] = p
    return out


REFUSED = ("refused",)  # empirical's one draw when the loop refuses an output: in no exact support


def empirical(n: int, target: Backend, prompt: list[int], config: GenerationConfig, drafter=None, policy=None, *,
              clock=None, key=tuple, refused: tuple[type[Exception], ...] = (),
              stats: list[GenerationStats] | None = None, overlap: bool = False) -> dict[tuple, int]:
    """How often each output comes out of `n` generations, as `key` reads the output's
    token ids: the i-th with `config` but seed i (a seed of its own for each output;
    a run is deterministic). `policy` is a Policy or K; `clock` times the calls (a
    FakeClock that costed backends move) where given. Each result's stats are
    appended to `stats` where given. A `refused` error (an output the loop will not
    emit, as a grammar's) ends the sample as one draw, REFUSED, that fits no
    distribution, so a check fails whatever the rest. `overlap`: the pair placed
    apart (stream's), drafting during the target's calls."""
    timing = () if clock is None else (clock,)
    counts: dict[tuple, int] = {}
    for i in range(n):
        try:
            result = generate(target, prompt, dataclasses.replace(config, seed=i), drafter, policy, *timing,
                              overlap=overlap)
        except refused:
            return {REFUSED: 1}
        output = key(result.token_ids)
        counts[output] = counts.get(output, 0) + 1
        if stats is not None:
            stats.append(result.stats)
    return counts


# The suite's statistical policy (docs/testing.md). Every goodness-of-fit check that a
# correct sampler must pass asserts p > ALPHA through assert_fits, which counts it: a
# correct sampler fails one with probability at most ALPHA over the seeds a run could
# draw, and `make test` prints the count and the sum of their alphas, the bound on the
# whole suite's false-alarm rate (the budget: 1e-4 per run). A negative control
# (a deliberately wrong sampler) asserts p < ALPHA through assert_misfits, and states in
# its test how far below ALPHA it lands, so a changed seed cannot make it pass by chance.
ALPHA = 1e-6
FITS = {"checks": 0, "alpha": 0.0, "unaccounted": 0}  # in this process; conftest.py reports them


def counted(alpha: float) -> None:
    """Count a statistical assertion made some other way (a binomial frequency within
    z standard deviations, say) at its false-alarm rate `alpha`, in the suite's bound."""
    FITS["checks"] += 1
    FITS["alpha"] += alpha


def assert_fits(counts: dict, exact: dict[tuple, float], n: int, alpha: float = ALPHA) -> float:
    """Assert that `counts` (n draws) fit `exact` at false-alarm rate `alpha`; the p-value."""
    p = _p_value(counts, exact, n)
    FITS["checks"] += 1
    FITS["alpha"] += alpha
    assert p > alpha, f"a sample of {n} fits the exact distribution with p = {p:.3g} (alpha {alpha:g})"
    return p


def assert_misfits(counts: dict, exact: dict[tuple, float], n: int, alpha: float = ALPHA) -> float:
    """Assert that `counts` do not fit `exact` (a negative control); the p-value."""
    p = _p_value(counts, exact, n)
    assert p < alpha, f"a wrong sampler's {n} draws fit the exact distribution (p = {p:.3g}, alpha {alpha:g})"
    return p


def token_fit_p_value(counts: dict, backend: Backend, prompt: list[int], sampling: SamplingConfig) -> float:
    """Goodness of fit of sampled sequences token by token (a Markov chain's transition
    test, Billingsley 1961): each token, given the tokens before it, must be a draw
    from the target's row for its context. Every draw from the same exact row (a
    trigram's rows depend on the last two tokens) is pooled, whatever its position and
    sequence, so each cell gathers many draws: at 4,000 sequences of 4 tokens it
    catches a logit off by 0.4 in every row at p ~ 1e-20, which the fit of whole
    sequences (exact_distribution's 6^4 cells) misses (p = 0.2 at a logit off by 0.2
    and 4,000 sequences, against 0.019 by position and 4e-6 pooled at 8,000).

    Under a correct sampler every draw is from its row given all that came before, so
    the Pearson statistic summed over rows (cells with expected count < 5 pooled
    within their row) is asymptotically chi-square with the summed degrees of freedom;
    a token outside its row's support gives p = 0.
    """
    rows = Sampler(prompt_length=len(prompt))
    row_of = {}  # prefix -> (row as a key, row)
    cells: dict[tuple, dict[int, int]] = {}  # row -> token -> count
    probs_of: dict[tuple, torch.Tensor] = {}
    for seq, count in counts.items():
        for i, token in enumerate(seq):
            prefix = tuple(seq[:i])
            if prefix not in row_of:
                context = list(prompt) + list(prefix)
                probs = rows.probs(backend.next_logits(context)[None], context, sampling)[0].double()
                row_of[prefix] = (tuple(round(float(x), 12) for x in probs), probs)
            key, probs = row_of[prefix]
            probs_of[key] = probs
            if probs[token] == 0:
                return 0.0
            row = cells.setdefault(key, {})
            row[token] = row.get(token, 0) + count
    stat, dof = 0.0, 0
    for key, row in cells.items():
        total = sum(row.values())
        row_stat, used = _pearson((row.get(token, 0), p * total) for token, p in enumerate(probs_of[key].tolist())
                                  if p > 0)
        stat += row_stat
        dof += max(used - 1, 0)
    return chi_square_tail(stat, dof) if dof else 1.0


def assert_follows(counts: dict, backend: Backend, prompt: list[int], sampling: SamplingConfig,
                   alpha: float = ALPHA) -> float:
    """Assert that sampled sequences follow `backend`'s distribution token by token
    (token_fit_p_value) at false-alarm rate `alpha`, counted in the suite's bound."""
    p = token_fit_p_value(counts, backend, prompt, sampling)
    FITS["checks"] += 1
    FITS["alpha"] += alpha
    n = sum(counts.values())
    assert p > alpha, f"{n} sequences follow the target token by token with p = {p:.3g} (alpha {alpha:g})"
    return p


def assert_does_not_follow(counts: dict, backend: Backend, prompt: list[int], sampling: SamplingConfig,
                           alpha: float = ALPHA) -> float:
    """Assert that a wrong sampler's sequences are caught token by token (a negative control)."""
    p = token_fit_p_value(counts, backend, prompt, sampling)
    assert p < alpha, f"a wrong sampler's {sum(counts.values())} sequences pass the token fit (p = {p:.3g})"
    return p


def chi_square_p_value(counts: dict, exact: dict[tuple, float], n: int) -> float:
    """The p-value for tests that set their own level (not yet through assert_fits:
    counted as unaccounted in the suite's summary)."""
    FITS["unaccounted"] += 1
    return _p_value(counts, exact, n)


def _p_value(counts: dict, exact: dict[tuple, float], n: int) -> float:
    """Pearson goodness of fit; cells with expected count < 5 are pooled.

    A sample outside the exact support makes the fit impossible: p = 0. The p-value is
    the chi-square distribution's upper tail, computed exactly (chi_square_tail); the
    statistic's own chi-square approximation is the usual one at 5 expected per cell.
    """
    if any(seq not in exact for seq in counts):
        return 0.0
    stat, cells = _pearson((counts.get(seq, 0), prob * n) for seq, prob in exact.items())
    dof = cells - 1
    if dof <= 0:
        return 1.0
    return chi_square_tail(stat, dof)


def _pearson(cells) -> tuple[float, int]:
    """Pearson's statistic over (observed, expected) cells, those expected below 5
    pooled into one; and the number of cells it summed."""
    stat, used, pool_obs, pool_exp = 0.0, 0, 0, 0.0
    for observed, expected in cells:
        if expected < 5:
            pool_obs += observed
            pool_exp += expected
            continue
        stat += (observed - expected) ** 2 / expected
        used += 1
    if pool_exp > 0:
        stat += (pool_obs - pool_exp) ** 2 / pool_exp
        used += 1
    return stat, used


def chi_square_tail(x: float, dof: int) -> float:
    """P(X >= x) for X chi-square with `dof` degrees of freedom: the regularized upper
    incomplete gamma Q(dof / 2, x / 2), by its series below a + 1 and Lentz's continued
    fraction above (Numerical Recipes' gammq), to about 1e-12 relative. (The
    Wilson-Hilferty normal approximation used before is off by factors in the far tail,
    where ALPHA sits.)"""
    a, z = dof / 2, x / 2
    if z <= 0:
        return 1.0
    log_front = a * math.log(z) - z - math.lgamma(a)
    if z < a + 1:  # P by its series; Q = 1 - P
        term = total = 1 / a
        k = a
        while abs(term) > abs(total) * 1e-16:
            k += 1
            term *= z / k
            total += term
        return max(0.0, 1.0 - total * math.exp(log_front))
    tiny = 1e-300
    b = z + 1 - a
    c, d = 1 / tiny, 1 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        step = d * c
        h *= step
        if abs(step - 1) < 1e-16:
            break
    return math.exp(log_front) * h


class FakeClock:
    """Time that moves only when a toy backend says a call took time."""

    def __init__(self):
        self.now = 0.0
        self.last = None  # the backend that made the last call

    def __call__(self) -> float:
        return self.now


class CostedBackend(Backend):
    """A backend whose calls take `cost(tokens scored)` seconds of a fake clock, and
    `cold` seconds more right after another backend's call (its weights pushed out of
    the CPU caches, as a target's are by a draft's steps)."""

    def __init__(self, inner, clock: FakeClock, cost, cold: float = 0.0):
        self.inner, self.clock, self.cost, self.cold = inner, clock, cost, cold
        self.name, self.vocab_size = inner.name, inner.vocab_size
        self.eos_token_ids, self.context_length, self.tokenizer = inner.eos_token_ids, inner.context_length, inner.tokenizer
        self.calls = 0

    @property
    def length(self) -> int:
        return self.inner.length

    def score(self, token_ids, num_logits):
        self.calls += 1
        self.clock.now += self.cost(len(token_ids)) + (self.cold if self.clock.last not in (None, self) else 0.0)
        self.clock.last = self
        return self.inner.score(token_ids, num_logits)

    def rollback(self, length):
        self.inner.rollback(length)

    def next_logits(self, context):
        return self.inner.next_logits(context)


def mixed_tables(vocab: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A target and a draft that agree on easy contexts and not on hard ones.

    After a token below vocab // 2 the target is peaked and the draft copies it (the
    draft is confident and right); after the others both are flat and unrelated (the
    draft is unsure and often wrong). A sequence wanders between the two, so an
    adaptive policy keeps changing its mind within a sequence.
    """
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(vocab, vocab, vocab, generator=g)
    draft = torch.randn(vocab, vocab, vocab, generator=g) * 0.5
    easy = torch.arange(vocab) < vocab // 2  # by the last token
    target[:, easy] *= 4.0
    target[:, ~easy] *= 0.5
    draft[:, easy] = target[:, easy]
    return target, draft


class DrafterWrapper:
    """A test drafter around another: counts, backend, offers and what it is told are
    the inner one's; a wrong drafter overrides `draft`."""

    def __init__(self, inner, name: str):
        self.inner, self.name = inner, name

    @property
    def calls(self):
        return self.inner.calls

    @property
    def model_backend(self):
        return self.inner.model_backend

    def offer(self, context, k, grammar=None):
        return self.inner.offer(context, k, grammar)

    def draft(self, context, plan, sampler, grammar=None):
        return self.inner.draft(context, plan, sampler, grammar)

    def accept(self, num_accepted):
        self.inner.accept(num_accepted)


class PieceTokenizer:
    """Tokens are byte strings (`pieces`); the last one, `eos`, is special and decodes
    to nothing. Encoding takes the longest piece first. Builds the grammar engine's
    tokenizer from the pieces, as the real backends build it from their vocabularies."""

    chat_template = None

    def __init__(self, pieces: list[bytes], eos: int, special: frozenset[int] = frozenset()):
        self.pieces, self.eos = pieces, eos
        self.special = special | {eos}  # tokens the grammar engine holds as special (as llama.cpp's <tool_call>)

    def encode(self, text: str) -> list[int]:
        data, out, i = text.encode(), [], 0
        while i < len(data):
            t = max((t for t, p in enumerate(self.pieces) if t != self.eos and data.startswith(p, i)),
                    key=lambda t: len(self.pieces[t]))
            out.append(t)
            i += len(self.pieces[t])
        return out

    def decode(self, token_ids: list[int]) -> str:
        return b"".join(self.pieces[t] for t in token_ids if t != self.eos).decode("utf-8", errors="replace")

    def chat_prompt(self, text: str) -> list[int]:
        return self.encode(text)

    def chat_messages(self, messages: list[dict], tools: list[dict] | None = None, check=None) -> list[int]:
        return self.encode("".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: ")

    def grammar_tokenizer(self, eos_token_ids):
        import llguidance

        tokenizer = self

        class Wrapped:
            tokens = [b"\xff" + p if t in self.special else p for t, p in enumerate(self.pieces)]
            eos_token_id, bos_token_id, special_token_ids = self.eos, None, sorted(self.special)

            def __call__(self, text):
                return tokenizer.encode(text.decode() if isinstance(text, bytes) else text)

        return llguidance.LLTokenizer(llguidance.TokenizerWrapper(Wrapped()))


def exact_constrained_distribution(backend, prompt: list[int], length: int, sampling: SamplingConfig,
                                   allowed_after) -> dict[tuple[int, ...], float]:
    """P(the constrained output, up to `length` tokens), by walking every allowed path.

    allowed_after(tokens) -> the token ids allowed after the output `tokens`; an empty
    set means the output is complete (generation stops there). Each step draws from
    the target's logits masked to the allowed set, then the sampling controls."""
    out = {}

    def walk(tokens: list[int], p: float) -> None:
        allowed = allowed_after(tokens) if len(tokens) < length else set()
        if not allowed:
            out[tuple(tokens)] = out.get(tuple(tokens), 0.0) + p
            return
        logits = backend.next_logits(prompt + tokens).clone()
        keep = torch.zeros_like(logits, dtype=torch.bool)
        keep[sorted(allowed)] = True
        probs = logits_to_probs(logits.masked_fill(~keep, float("-inf"))[None], sampling)[0]
        for token in sorted(allowed):
            if probs[token] > 0:
                walk(tokens + [token], p * float(probs[token]))

    walk([], 1.0)
    return out


# Every byte, plus pieces longer than one byte, so that forced text has several
# tokenizations and the engine's own (longest first) is the forced one.
BYTE_PIECES = [bytes([i]) for i in range(256)] + [b'{"', b'": ', b'", "', b", ", b"true", b"false", b"<eos>"]
BYTE_EOS = len(BYTE_PIECES) - 1


class BigramBackend(TrigramBackend):
    """Next-token logits depend on the last token only: table[prev1] ([V, V])."""

    def next_logits(self, context: list[int]) -> torch.Tensor:  # [V]
        return self.table[context[-1]]


def byte_backend(seed: int, name: str = "bytes") -> BigramBackend:
    """A random bigram model over bytes (BYTE_PIECES) with a tokenizer the grammar
    engine can read: JSON, regexes and grammars of any text can be sampled from it."""
    g = torch.Generator().manual_seed(seed)
    b = BigramBackend(torch.randn(len(BYTE_PIECES), len(BYTE_PIECES), generator=g) * 2, name=name)
    b.tokenizer, b.eos_token_ids = PieceTokenizer(BYTE_PIECES, BYTE_EOS), frozenset({BYTE_EOS})
    return b


class TrigramSequences(Backend):
    """Several trigram sequences in one backend (as llama.cpp holds them): each request
    of a batch is scored on its own sequence's tokens. Records every call as the list
    of (sequence, tokens scored)."""

    def __init__(self, table: torch.Tensor, sequences: int, name: str = "trigram"):
        self.members = [TrigramBackend(table, name) for _ in range(sequences)]
        self.sequences, self.name = sequences, name
        self.vocab_size = table.shape[-1]
        self.eos_token_ids = frozenset()
        self.context_length = 10_000
        self.tokenizer = None
        self.calls: list[list[tuple[int, int]]] = []

    @property
    def length(self) -> int:
        return self.members[0].length

    def score(self, token_ids, num_logits):
        return self.score_many([(0, token_ids, num_logits)])[0]

    def rollback(self, length):
        self.members[0].rollback(length)

    def sequence_length(self, seq):
        return self.members[seq].length

    def rollback_sequence(self, seq, length):
        self.members[seq].rollback(length)

    def cached_tokens(self):
        return self.members[0].cached_tokens()

    def sequence_tokens(self, seq):
        return self.members[seq].cached_tokens()

    saves_sequences = True

    def save_sequence(self, seq):
        return self.members[seq].save_sequence()

    def restore_sequence(self, seq, saved, length):
        self.members[seq].restore_sequence(0, saved, length)

    def score_many(self, requests):
        self.calls.append([(seq, len(ids)) for seq, ids, _ in requests])
        return [self.members[seq].score(ids, n) for seq, ids, n in requests]


class CrossTalk(TrigramSequences):
    """A broken batch: in a call of several sequences, each one's rows lean towards the
    token the next sequence ended on (state leaking between sequences)."""

    def score_many(self, requests):
        rows = super().score_many(requests)
        if len(requests) < 2:
            return rows
        lasts = [self.members[seq].tokens[-1] for seq, _, _ in requests]
        leaked = []
        for i, r in enumerate(rows):
            other = lasts[(i + 1) % len(lasts)]
            leaked.append(r + 1.5 * torch.nn.functional.one_hot(torch.tensor(other), self.vocab_size))
        return leaked


# A chat template that shows its model Hermes-style tool calls (tools.py reads the
# format from it), rendered by the llama.cpp backend's renderer.
TOOL_TEMPLATE = """{%- if tools %}tools:{% for tool in tools %} {{ tool | tojson }}{% endfor %}
Call a tool as <tool_call>
{"name": <name>, "arguments": <args>}
</tool_call>
{% endif %}
{%- for m in messages %}{{ m.role }}: {% if m.content %}{{ m.content }}{% endif %}
{%- for c in m.tool_calls or [] %}<tool_call>
{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}
</tool_call>{% endfor %}{{ "\\n" }}
{%- endfor %}assistant: """


class ToolTokenizer(PieceTokenizer):
    chat_template = TOOL_TEMPLATE

    def chat_messages(self, messages: list[dict], tools: list[dict] | None = None, check=None) -> list[int]:
        from specsample.backends.chat import chat_token_ids
        from specsample.backends.llamacpp import render_chat

        return chat_token_ids(lambda chat: render_chat(TOOL_TEMPLATE, chat, tools=tools), messages,
                              lambda text, special: self.encode(text), tools, check=check)


def tool_backend(seed: int, name: str = "bytes") -> BigramBackend:
    """byte_backend with a chat template that takes tools."""
    b = byte_backend(seed, name)
    b.tokenizer = ToolTokenizer(BYTE_PIECES, BYTE_EOS)
    return b
