"""Exact toy models: a fixed random trigram table, cheap enough to sample 20,000 times
and small enough to enumerate the exact distribution of the next few tokens."""

from __future__ import annotations

import itertools
import math

import torch

from specsample.backends.base import Backend
from specsample.sampling import Sampler, SamplingConfig, logits_to_probs


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


def chi_square_p_value(counts: dict, exact: dict[tuple, float], n: int) -> float:
    """Pearson goodness of fit; cells with expected count < 5 are pooled.

    A sample outside the exact support makes the fit impossible: p = 0. The p-value
    uses the Wilson-Hilferty normal approximation of the chi-square tail.
    """
    if any(seq not in exact for seq in counts):
        return 0.0
    stat, cells, pool_obs, pool_exp = 0.0, 0, 0, 0.0
    for seq, prob in exact.items():
        expected = prob * n
        if expected < 5:
            pool_obs += counts.get(seq, 0)
            pool_exp += expected
            continue
        stat += (counts.get(seq, 0) - expected) ** 2 / expected
        cells += 1
    if pool_exp > 0:
        stat += (pool_obs - pool_exp) ** 2 / pool_exp
        cells += 1
    dof = cells - 1
    if dof <= 0:
        return 1.0
    z = ((stat / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    return 0.5 * math.erfc(z / math.sqrt(2))


class FakeClock:
    """Time that moves only when a toy backend says a call took time."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class CostedBackend(Backend):
    """A backend whose calls take `cost(tokens scored)` seconds of a fake clock."""

    def __init__(self, inner, clock: FakeClock, cost):
        self.inner, self.clock, self.cost = inner, clock, cost
        self.name, self.vocab_size = inner.name, inner.vocab_size
        self.eos_token_ids, self.context_length, self.tokenizer = inner.eos_token_ids, inner.context_length, inner.tokenizer
        self.calls = 0

    @property
    def length(self) -> int:
        return self.inner.length

    def score(self, token_ids, num_logits):
        self.calls += 1
        self.clock.now += self.cost(len(token_ids))
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

    def chat_messages(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
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

    def chat_messages(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        from specsample.backends.chat import chat_token_ids
        from specsample.backends.llamacpp import render_chat

        return chat_token_ids(lambda chat: render_chat(TOOL_TEMPLATE, chat, tools=tools), messages,
                              lambda text, special: self.encode(text), tools)


def tool_backend(seed: int, name: str = "bytes") -> BigramBackend:
    """byte_backend with a chat template that takes tools."""
    b = byte_backend(seed, name)
    b.tokenizer = ToolTokenizer(BYTE_PIECES, BYTE_EOS)
    return b
