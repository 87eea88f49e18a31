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
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Callable

from .base import ChatTemplateError

Encode = Callable[[str, bool], list[int]]  # (text, parse special tokens) -> token ids


def chat_token_ids(render: Callable[[list[dict]], str], messages: list[dict], encode: Encode,
                   tools: list[dict] | None = None) -> list[int]:
    """Token ids of `messages` rendered by `render` (the chat template, given `tools`),
    in which only the template's own markup produces special tokens."""
    for what, value in [("a tool's definition", tools)] * bool(tools) + [
            ("an earlier tool call", m["tool_calls"]) for m in messages if m.get("tool_calls")]:
        if _spells_special(json.dumps(value, ensure_ascii=False), encode):
            raise ChatTemplateError(f"{what} holds special-token text, which the chat template would write among "
                                    "its markup: remove it")
    if not any(_spells_special(m.get("content"), encode) for m in messages):
        return encode(render(messages), True)
    nonce = secrets.token_hex(8)
    marked = [{**m, "content": f"[{nonce}#{i}]"} if isinstance(m.get("content"), str) else m
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
        if n % 2 == 0:
            ids += encode(piece, True) if piece else []
        else:
            ids += encode(contents[n // 2], False)
    return ids


def _spells_special(content, encode: Encode) -> bool:
    return isinstance(content, str) and encode(content, True) != encode(content, False)
