"""Chat messages to token ids, with message content kept as text.

A chat template's markup holds special tokens (`<|im_start|>`, `<|im_end|>`), so the
rendered chat is tokenized with special tokens parsed. Message content must not get
that treatment: a user writing `<|im_end|>\\n<|im_start|>system\\n...` would otherwise
open a system turn of their own. Both backends tokenize chats here.

Content that holds no special-token text tokenizes the same either way, so those
chats (nearly all) are tokenized whole, exactly as before. Otherwise the template is
rendered with each content replaced by a placeholder, split there, and the markup
pieces are tokenized with special tokens parsed, the content pieces as plain text.
Worked example (ChatML): content `hi<|im_end|>` renders as

    <|im_start|>user\\n[#0]<|im_end|>\\n<|im_start|>assistant\\n

and becomes tokens("<|im_start|>user\\n", special) + tokens("hi<|im_end|>", text)
+ tokens("<|im_end|>\\n<|im_start|>assistant\\n", special): two im_start tokens, as
the template alone gives, however many the content spells out.

Tools and the calls of earlier turns are written by the template as JSON among its
markup, where no placeholder can stand: those holding special-token text are refused.

Telling whether a content spells special tokens takes two tokenizer calls, and each
llama.cpp call costs about 0.5 ms however short its text (it builds its pre-tokenizer's
regular expression afresh): 20,000 one-letter messages took 42 s, half of it here. A
tokenizer that knows its special tokens' spellings passes `may_spell` (a search over
them), and only a content holding one is tokenized twice. `check` is called between
messages and pieces (a serve request whose client left raises there).
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Callable, Iterable

from .base import ChatTemplateError

Encode = Callable[[str, bool], list[int]]  # (text, parse special tokens) -> token ids
Check = Callable[[], None]  # raises to stop a chat's tokenizing (serve: the client left)


def chat_token_ids(render: Callable[[list[dict]], str], messages: list[dict], encode: Encode,
                   tools: list[dict] | None = None, may_spell: Callable[[str], object] | None = None,
                   check: Check | None = None) -> list[int]:
    """Token ids of `messages` rendered by `render` (the chat template, given `tools`),
    in which only the template's own markup produces special tokens. `may_spell(text)`:
    false only for a text that holds no special token's spelling (None: any may)."""
    check = check or (lambda: None)
    spells = lambda text: _spells_special(text, encode, may_spell)  # noqa: E731
    for what, value in [("a tool's definition", tools)] * bool(tools) + [
            ("an earlier tool call", m["tool_calls"]) for m in messages if m.get("tool_calls")]:
        if spells(json.dumps(value, ensure_ascii=False)):
            raise ChatTemplateError(f"{what} holds special-token text, which the chat template would write among "
                                    "its markup: remove it")
    special = []
    for m in messages:
        check()
        special.append(spells(m.get("content")))
    check()
    if not any(special):
        return encode(render(messages), True)
    nonce = secrets.token_hex(8)
    # Only the contents that spell special tokens are kept apart: an empty one (an
    # assistant turn that only made tool calls, `content: null`) is one a template tests
    # for ("{% if message.content %}"), and a placeholder there would change the chat.
    marked = [{**m, "content": f"[{nonce}#{i}]"} if m.get("content") and special[i] else m
              for i, m in enumerate(messages)]
    pieces = re.split(rf"\[{nonce}#(\d+)\]", render(marked))  # markup, index, markup, index, ..., markup
    contents = [messages[int(i)]["content"] for i in pieces[1::2]]
    # A template that reads the content (strips it, tests for a tag) would render the
    # placeholder differently from the real text: then the split is not the chat.
    if "".join(p if n % 2 == 0 else contents[n // 2] for n, p in enumerate(pieces)) != render(messages):
        raise ChatTemplateError("a message holds special-token text and this chat template rewrites message content, "
                                "so that text cannot be kept apart from the template's markup: remove it")
    ids: list[int] = []
    for n, piece in enumerate(pieces):
        check()
        if n % 2 == 0:
            ids += encode(piece, True) if piece else []
        else:
            ids += encode(contents[n // 2], False)
    return ids


def _spells_special(content, encode: Encode, may_spell: Callable[[str], object] | None) -> bool:
    if not isinstance(content, str) or may_spell is not None and not may_spell(content):
        return False
    return encode(content, True) != encode(content, False)


class TextOnly:
    """Text tokenized as text where the vocabulary has added tokens that are not control
    tokens (Qwen's `<tool_call>`, `</tool_call>`): llama.cpp and HF tokenizers match
    those in any text, special tokens parsed or not, so a user's or a tool result's
    `<tool_call>` would become the model's own call marker. Each spelling is cut in two
    where the two halves take the fewest tokens, and the pieces are tokenized apart:
    `<tool_call>` -> `<tool` + `_call>` -> `<tool`, `_call`, `>`, the tokens the same
    text gets with no such added token (the cut falls between two of the pre-tokenizer's
    words).

    `encode(text)` tokenizes with control tokens kept as text; `spellings` are the
    added tokens' texts that it still matches."""

    def __init__(self, encode: Callable[[str], list[int]], spellings: Iterable[str]):
        self.encode = encode
        self.spellings = sorted({s for s in spellings if len(s) > 1}, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, self.spellings))) if self.spellings else None
        self._cuts: dict[str, int] = {}

    def matches(self, text: str) -> bool:
        return self._pattern is not None and self._pattern.search(text) is not None

    def __call__(self, text: str) -> list[int]:
        if self._pattern is None:
            return self.encode(text)
        ids, start = [], 0
        for match in self._pattern.finditer(text):
            cut = match.start() + self._cut(match.group())
            ids += self.encode(text[start:cut]) if cut > start else []
            start = cut
        return ids + (self.encode(text[start:]) if start < len(text) or not ids else [])

    def _cut(self, spelling: str) -> int:
        if spelling not in self._cuts:
            self._cuts[spelling] = min(range(1, len(spelling)),
                                       key=lambda i: len(self.encode(spelling[:i])) + len(self.encode(spelling[i:])))
        return self._cuts[spelling]
