"""Structured output: a grammar decides, at every position, which tokens may come next.

The constrained target is the target's distribution renormalised over the tokens the
grammar allows after the text so far (its logits set to -inf elsewhere, before
temperature, top-k and top-p). Speculation stays exact because every row is masked
by the grammar state *of its own prefix*: a draft row at position i by the state
after the context and drafts 0..i-1, the target's row i by the same state, so that
modified rejection sampling compares the constrained target with the distribution
each draft was really drawn from. Lookup proposals are cut at the first token the
grammar forbids. The state advances with drafts and rolls back after a rejection;
masks it computed while drafting are kept for the target's rows of the same prefix.

Forced text. Where the grammar allows only one continuation (a key, a closing quote,
a separator), the engine names its tokens ("fast-forward tokens": the forced bytes in
the tokenizer's own tokenization). The constraint then allows exactly that token at
that position, so the constrained target puts probability 1 on it: it is emitted
without sampling, and the drafter offers it as a draft of its own source ("forced")
that verification accepts with probability 1. Worked example, a schema with a
required key "name", the text so far `{"`:

    forced at this position    name, ": "        (the engine's tokens for `name": "`)
    allowed here               only `name`       (the tokenizer's `na`, `nam` are not)
    after `name`               only `": "`
    after `": "`               any string token  (a real choice: masked target)

Forced tokens are a function of the prefix (the pending ones are kept with each
position and restored on rollback), so plain decoding and speculation see the same
constraint, and greedy speculative output equals greedy constrained output.

Engine: llguidance (https://github.com/guidance-ai/llguidance). It takes JSON
schemas, regular expressions and Lark grammars (and converts llama.cpp's GBNF),
builds its tokenizer from the vocabulary of the model we load (a GGUF file's or a
Hugging Face tokenizer's, no download), computes a 152k-token mask in well under a
millisecond without precompiling the grammar per vocabulary, rolls a matcher back by
any number of tokens (what speculation needs), and computes the forced tokens
itself. xgrammar also rolls back and is fast, but its forced-text support is bytes,
not tokens, and it compiles each grammar against the vocabulary first; outlines-core
compiles regular languages to an index per vocabulary (seconds for a JSON schema)
and has no context-free grammars.
"""

from __future__ import annotations

import json
import math
import time
import weakref
from dataclasses import dataclass, field

import numpy as np
import torch


KINDS = ("json_schema", "regex", "grammar")

# JSON is written as json.dumps writes it (", " and ": ", no other whitespace), so
# braces, quotes, keys and separators are all forced, and the layout is the one these
# models have seen most.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


# serde_json's nesting limit, which llguidance parses schemas with: checked first, so a
# schema nested deeper is refused by its depth, before Python's json recurses on it.
MAX_SCHEMA_DEPTH = 128


class ConstraintError(ValueError):
    """A schema, regex or grammar that cannot be used; the message is one line."""


@dataclass(frozen=True)
class Constraint:
    """What the output must match: a JSON schema (a dict or its text), a regular
    expression, or a grammar (Lark, as llguidance takes it, or GBNF). `strict=False`
    ignores schema keywords the engine does not implement instead of refusing them."""

    kind: str
    source: str
    strict: bool = True
    grammar: str = field(init=False, repr=False, compare=False)  # the engine's form
    # What strict=False let through unenforced (the engine's warnings, one line each:
    # unimplemented keywords such as `not` or `uniqueItems`, unknown formats); the
    # output may break these parts of the schema.
    unenforced: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        llguidance = _engine_module()
        if self.kind not in KINDS:
            raise ConstraintError(f"unknown constraint kind {self.kind!r}; choose from {', '.join(KINDS)}")
        try:
            if self.kind == "json_schema":
                grammar = llguidance.LLMatcher.grammar_from_json_schema(
                    _schema_text(self.source), defaults=JSON_LAYOUT, overrides={"lenient": not self.strict})
            else:
                grammar = llguidance.grammar_from("regex" if self.kind == "regex" else "grammar", self.source)
        except ValueError as e:
            raise ConstraintError(f"{_what(self.kind)}: {_one_line(e)}") from None
        except RecursionError:
            raise ConstraintError(f"{_what(self.kind)}: nested too deeply") from None
        failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
        if failed:
            raise ConstraintError(f"{_what(self.kind)}: {_one_line(messages[0])}")
        object.__setattr__(self, "grammar", grammar)
        object.__setattr__(self, "unenforced", tuple(_one_line(m) for m in messages))

    @classmethod
    def json_schema(cls, schema: dict | str, strict: bool = True) -> "Constraint":
        if not isinstance(schema, str):
            _check_depth(schema)
        return cls("json_schema", schema if isinstance(schema, str) else json.dumps(schema), strict)

    @classmethod
    def json_object(cls) -> "Constraint":
        """Any JSON object (OpenAI's `json_object` response format)."""
        return cls.json_schema({"type": "object"})

    @classmethod
    def regex(cls, pattern: str) -> "Constraint":
        return cls("regex", pattern)

    @classmethod
    def lark(cls, grammar: str) -> "Constraint":
        return cls("grammar", grammar)


def _engine_module():
    try:
        import llguidance
    except ImportError:
        raise ConstraintError("structured output needs llguidance: pip install 'specsample[structured]'") from None
    return llguidance


def _schema_text(source: str) -> str:
    try:
        schema = json.loads(source)
    except ValueError as e:
        raise ValueError(f"not JSON: {e}") from None
    except RecursionError:
        raise ValueError(f"nested more than {MAX_SCHEMA_DEPTH} levels deep") from None
    if not isinstance(schema, (dict, bool)):
        raise ValueError(f"a schema is a JSON object, not {type(schema).__name__}")
    _check_depth(schema)
    return source


def _check_depth(schema) -> None:
    """Refuses a schema nested deeper than MAX_SCHEMA_DEPTH, walking it without recursion."""
    level = [schema]
    for depth in range(MAX_SCHEMA_DEPTH + 1):
        level = [v for node in level if isinstance(node, (dict, list))
                 for v in (node.values() if isinstance(node, dict) else node)]
        if not level:
            return
    raise ConstraintError(f"{_what('json_schema')}: nested more than {MAX_SCHEMA_DEPTH} levels deep")


def _what(kind: str) -> str:
    return {"json_schema": "invalid JSON schema", "regex": "invalid regex", "grammar": "invalid grammar"}[kind]


def _one_line(error) -> str:
    return " ".join(str(error).split())


# ---- one sequence's grammar state ----------------------------------------------------

# What a row may hold: a single forced token, or a mask over the vocabulary.
Allowed = int | torch.Tensor  # int, or [vocab] bool


@dataclass
class _Position:
    forced: tuple[int, ...] | None = None  # tokens forced from here on; None: not asked yet
    mask: torch.Tensor | None = None  # [vocab] bool, computed when needed
    done: bool | None = None  # only an end of sequence may follow; None: not asked yet


class GrammarState:
    """Where one sequence stands in its grammar, counted in generated tokens.

    `allowed()` says what may come next, `advance(token)` moves on, `rollback(n)`
    forgets the last n tokens. Positions a rollback leaves are kept as a cache: when
    the same tokens come again (the target's rows after a draft, the emitted tokens
    after verification) their masks are not computed twice.

    `budget` caps how many tokens forced text may reach (the generation's token
    budget less one: the round's last token is always the target's own). `seconds`
    is the time spent in the grammar engine (masks, forced tokens, moves), the cost
    of the constraint.
    """

    def __init__(self, matcher, vocab_size: int, eos_token_ids, budget: int):
        self._matcher = matcher  # an llguidance.LLMatcher at the start of the grammar
        self.vocab_size = vocab_size
        self._text_tokens = torch.ones(vocab_size, dtype=torch.bool)  # [vocab]: all but end-of-sequence tokens
        self._text_tokens[[t for t in eos_token_ids if t < vocab_size]] = False
        self.budget = budget
        self.length = 0  # tokens the matcher has consumed
        self._tokens: list[int] = []  # consumed tokens, then those a rollback left (the cache)
        self._positions: list[_Position] = [_Position()]  # [i]: after _tokens[:i]
        self.seconds = 0.0

    @property
    def room(self) -> int:
        """Tokens the budget still leaves."""
        return max(0, self.budget - self.length)

    @property
    def done(self) -> bool:
        """Nothing but an end of sequence may follow: the output is complete."""
        if self._matcher.is_stopped():
            return True
        if not self._matcher.is_accepting():
            return False
        here = self._positions[self.length]
        if here.done is None:  # complete text that could also go on? (the engine stops only after a token)
            allowed = self.allowed()
            here.done = not isinstance(allowed, int) and not bool((allowed & self._text_tokens).any())
        return here.done

    def forced(self) -> tuple[int, ...]:
        """The tokens forced from here on, as far as the budget reaches."""
        return self._forced_here()[: self.room]

    def _forced_here(self) -> tuple[int, ...]:
        here = self._positions[self.length]
        if here.forced is None:
            t0 = time.perf_counter()
            here.forced = () if self._matcher.is_stopped() else tuple(self._matcher.compute_ff_tokens())
            self.seconds += time.perf_counter() - t0
        return here.forced

    def allowed(self) -> Allowed:
        """The forced token, or the mask of tokens the grammar allows here."""
        forced = self._forced_here()
        if forced:
            return forced[0]
        here = self._positions[self.length]
        if here.mask is None:
            t0 = time.perf_counter()
            bits = np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8)
            mask = np.unpackbits(bits, bitorder="little")[: self.vocab_size]
            if mask.shape[0] < self.vocab_size:  # tokens the engine does not know: forbidden
                mask = np.pad(mask, (0, self.vocab_size - mask.shape[0]))
            here.mask = torch.from_numpy(mask.view(bool))
            self.seconds += time.perf_counter() - t0
        return here.mask

    def accepts(self, token: int) -> bool:
        forced = self._forced_here()
        if forced:
            return token == forced[0]
        here = self._positions[self.length]
        if here.mask is not None:
            return 0 <= token < self.vocab_size and bool(here.mask[token])
        t0 = time.perf_counter()
        valid = 0 <= token < self.vocab_size and self._matcher.validate_tokens([token]) == 1
        self.seconds += time.perf_counter() - t0
        return valid

    def advance(self, token: int) -> bool:
        """Consume a token the grammar allows; True when it was forced."""
        if not self.accepts(token):
            raise ConstraintError(f"token {token} is not allowed by the grammar after {self.length} tokens")
        forced = self._forced_here()
        t0 = time.perf_counter()
        if not self._matcher.consume_token(token):
            raise ConstraintError(f"the grammar engine refused token {token}: {self._matcher.get_error()}")
        self.seconds += time.perf_counter() - t0
        if self.length < len(self._tokens) and self._tokens[self.length] == token:
            self.length += 1  # the cached position after it is still right
            return bool(forced)
        del self._tokens[self.length :], self._positions[self.length + 1 :]
        self._tokens.append(token)
        # Forced text continues where it was started, not re-tokenized from each
        # position: the tokenization of a suffix can differ from the suffix of one.
        self._positions.append(_Position(forced=forced[1:] or None))
        self.length += 1
        return bool(forced)

    def rollback(self, n: int) -> None:
        if n:
            if n > self.length or not self._matcher.rollback(n):
                raise ConstraintError(f"cannot roll the grammar back by {n} tokens from {self.length}")
            self.length -= n

    def advance_forced(self) -> list[int]:
        """Consume the forced tokens from here (within the budget); returns them."""
        tokens = list(self.forced())
        for token in tokens:
            self.advance(token)
        return tokens

    def accepted_prefix(self, tokens: list[int]) -> list[int]:
        """The longest prefix of tokens the grammar allows from here."""
        n = 0
        while n < len(tokens) and not self.done and self.accepts(tokens[n]):
            self.advance(tokens[n])
            n += 1
        self.rollback(n)
        return tokens[:n]

    def rows_allowed(self, tokens: list[int]) -> list[Allowed]:
        """What the grammar allows at each row a target call scores: here, and after
        each prefix of tokens (len(tokens) + 1 entries). A token the grammar forbids
        (a draft it did not constrain) will be rejected, so the rows after it are never
        used; they repeat the last row that can be reached."""
        rows, n = [self.allowed()], 0
        for token in tokens:
            if self.accepts(token):
                self.advance(token)
                n += 1
                rows.append(self.allowed())
            else:
                rows += [rows[-1]] * (len(tokens) + 1 - len(rows))
                break
        self.rollback(n)
        return rows


def mask_logits(logits: torch.Tensor, allowed: list[Allowed]) -> torch.Tensor:
    """logits [n, vocab] with every token a row does not allow set to -inf."""
    masked = torch.full_like(logits, float("-inf"))
    for i, row in enumerate(allowed):
        if isinstance(row, int):
            masked[i, row] = logits[i, row]
        else:
            masked[i] = logits[i].masked_fill(~row, float("-inf"))
    return masked


def allows_any(logits: torch.Tensor) -> bool:
    """Whether masked logits [1, vocab] leave a token with finite logit: a draft that
    scores only part of the vocabulary may give none of the allowed tokens any mass."""
    return math.isfinite(float(logits.amax()))


def constrained_logits(logits: torch.Tensor, allowed: list[Allowed] | None) -> torch.Tensor:
    """logits [n, vocab] with each row masked to what the grammar allows after its own
    prefix (all of them without a grammar); the sampling controls then turn them into
    the distribution each row's token is drawn from (Sampler.probs). A forced row
    keeps one finite logit, so its distribution is one-hot whatever the controls.

    The target scores the whole vocabulary, so every row it masks keeps some mass.
    """
    return logits if allowed is None else mask_logits(logits, allowed)


# ---- the engine's tokenizer, from the model's own ------------------------------------

class Engine:
    """llguidance's tokenizer for one vocabulary, and the grammars compiled for it: a
    matcher is built once per grammar (~1 ms for a small one, more for a large
    schema) and copied for each generation (~1 us)."""

    CACHED_GRAMMARS = 32

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._compiled: dict[str, object] = {}

    def matcher(self, constraint: Constraint):
        import llguidance

        template = self._compiled.pop(constraint.grammar, None)
        if template is None:
            template = llguidance.LLMatcher(self.tokenizer, constraint.grammar)
            if template.is_error():
                raise ConstraintError(f"{_what(constraint.kind)}: {_one_line(template.get_error())}")
            if len(self._compiled) >= self.CACHED_GRAMMARS:
                self._compiled.pop(next(iter(self._compiled)))  # the least recently used
        self._compiled[constraint.grammar] = template
        return template.deep_copy()


def engine_for(backend) -> Engine:
    """The grammar engine over a backend's vocabulary, built once per tokenizer (~1 s
    for 152k tokens): each engine's tokenizer builds llguidance's (`grammar_tokenizer`)."""
    tokenizer = backend.tokenizer
    if tokenizer is None or not hasattr(tokenizer, "grammar_tokenizer"):
        raise ConstraintError(f"{backend.name}: structured output needs the model's tokenizer, and this backend "
                              "has none that the grammar engine can read")
    engine = _ENGINES.get(tokenizer)
    if engine is None:
        engine = _ENGINES[tokenizer] = Engine(tokenizer.grammar_tokenizer(sorted(backend.eos_token_ids)))
    return engine


# Keyed by the tokenizer object: an engine lives as long as its tokenizer.
_ENGINES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def start(constraint: Constraint, target, max_new_tokens: int) -> GrammarState:
    """A fresh grammar state for one generation on `target`. A grammar that admits no
    text at all (a schema that only refers to itself: {"$ref": "#"}) is refused here,
    before any model call, rather than answered with an empty "valid" output."""
    state = GrammarState(engine_for(target).matcher(constraint), target.vocab_size, target.eos_token_ids,
                         max_new_tokens - 1)
    allowed = state.allowed()  # the engine still allows an end of sequence there: no text, not accepting
    if not isinstance(allowed, int) and not bool((allowed & state._text_tokens).any()) \
            and not state._matcher.is_accepting():
        raise ConstraintError(f"{_what(constraint.kind)}: it admits no output at all (a definition that only "
                              "refers to itself?)")
    return state
