"""The OpenAI shapes of an answer: chat or text completion, whole or in chunks, with
n choices, log-probabilities and usage; and the answer so far, built from the
worker's events."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from ..backends.base import Tokenizer
from ..generate import GenerationResult
from ..logprobs import TokenLogprob
from .events import ChoiceEvent, Finished, Generated, PromptScored

FINISH_REASONS = {"length": "length", "eos": "stop", "stop_string": "stop", "grammar": "stop"}
# JSON has no -inf: a token the controls removed ("processed" log-probabilities) gets
# this floor, as several OpenAI-compatible servers do.
LOGPROB_FLOOR = -9999.0


@dataclass
class Choice:
    """What one choice has produced so far (the whole answer's parts, or one chunk's)."""

    index: int
    text: str = ""
    entries: list[tuple[int, TokenLogprob | None]] = field(default_factory=list)  # None: a prompt's first token


class Reply:
    def __init__(self, chat: bool, model: str, prompt_tokens: int, drafter_name: str | None,
                 tokenizer: Tokenizer | None = None, logprobs: int | None = None):
        self.chat, self.model, self.prompt_tokens, self.drafter_name = chat, model, prompt_tokens, drafter_name
        self.tokenizer = tokenizer
        self.logprobs = logprobs  # None: none asked for; N: alternatives per token
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self._pieces: dict[int, str] = {}
        self._offsets: dict[int, int] = {}  # choice -> text offset of its next token (completions)

    def _wrap(self, obj: str, choices: list, **extra) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices,
                **extra}

    # ---- chunks ----

    def chunk(self, part: Choice, finish_reason: str | None = None, role: bool = False) -> dict:
        logprobs = self._logprobs(part) if part.entries else None
        if not self.chat:
            choice = {"index": part.index, "text": part.text, "logprobs": logprobs, "finish_reason": finish_reason}
            return self._wrap("text_completion", [choice])
        delta = {"role": "assistant", "content": ""} if role else {"content": part.text} if part.text else {}
        return self._wrap("chat.completion.chunk", [{"index": part.index, "delta": delta, "logprobs": logprobs,
                                                     "finish_reason": finish_reason}])

    def usage_chunk(self, results: dict[int, GenerationResult]) -> dict:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return self._wrap(obj, [], usage=self.usage(results))

    # ---- whole ----

    def whole(self, parts: dict[int, Choice], results: dict[int, GenerationResult]) -> dict:
        choices = []
        for index in sorted(results):
            part, finish = parts[index], FINISH_REASONS[results[index].stop_reason]
            logprobs = self._logprobs(part) if self.logprobs is not None else None
            if self.chat:
                choices.append({"index": index, "message": {"role": "assistant", "content": part.text},
                                "logprobs": logprobs, "finish_reason": finish})
            else:
                choices.append({"index": index, "text": part.text, "logprobs": logprobs, "finish_reason": finish})
        return self._wrap("chat.completion" if self.chat else "text_completion", choices, usage=self.usage(results))

    def usage(self, results: dict[int, GenerationResult]) -> dict:
        n = sum(len(r.token_ids) for r in results.values())
        # An extension: the speculative statistics (acceptance rate, tokens per target
        # call, accepted-per-round histogram, time split); one object per choice when
        # there are several.
        stats = [{"drafter": self.drafter_name, **results[i].stats.as_dict()} for i in sorted(results)]
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": n, "total_tokens": self.prompt_tokens + n,
                "speculative": stats[0] if len(stats) == 1 else stats}

    # ---- log-probabilities ----

    def _piece(self, token: int) -> str:
        if token not in self._pieces:
            self._pieces[token] = self.tokenizer.decode([token])
        return self._pieces[token]

    def _logprobs(self, part: Choice) -> dict:
        return self._chat_logprobs(part) if self.chat else self._completion_logprobs(part)

    def _completion_logprobs(self, part: Choice) -> dict:
        """The legacy shape: tokens, token_logprobs, top_logprobs (the N likeliest and the
        chosen token, as vLLM gives them), text_offset (into the choice's text)."""
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        offset = self._offsets.get(part.index, 0)
        for token, lp in part.entries:
            piece = self._piece(token)
            out["tokens"].append(piece)
            out["text_offset"].append(offset)
            offset += len(piece)
            if lp is None:  # a prompt's first token: nothing predicts it
                out["token_logprobs"].append(None)
                out["top_logprobs"].append(None)
                continue
            out["token_logprobs"].append(_finite(lp.logprob))
            top = {self._piece(t): _finite(v) for t, v in lp.top}
            top.setdefault(piece, _finite(lp.logprob))
            out["top_logprobs"].append(top)
        self._offsets[part.index] = offset
        return out

    def _chat_logprobs(self, part: Choice) -> dict:
        def entry(token: int, value: float) -> dict:
            piece = self._piece(token)
            return {"token": piece, "logprob": _finite(value), "bytes": list(piece.encode())}

        return {"content": [{**entry(token, lp.logprob), "top_logprobs": [entry(t, v) for t, v in lp.top]}
                            for token, lp in part.entries]}


class Answer:
    """The answer so far, from the worker's events: each event's part of its choice,
    and the whole of every choice."""

    def __init__(self, echoes: dict[int, tuple[list[int], str | None]], tokenizer: Tokenizer):
        self.echoes = echoes  # choice -> its prompt's ids and text, sent before the choice's first text
        self.tokenizer = tokenizer
        self.whole: dict[int, Choice] = {}
        self.results: dict[int, GenerationResult] = {}

    def part(self, event: ChoiceEvent) -> Choice | None:
        """The new part of a choice an event brings, or None."""
        index = event.index
        whole = self.whole.setdefault(index, Choice(index))
        part = Choice(index)
        if index in self.echoes and not whole.text and not whole.entries:  # the prompt comes first
            ids, text = self.echoes.pop(index)
            part.text = text if text is not None else self.tokenizer.decode(ids)
            if isinstance(event, PromptScored):
                part.entries = list(zip(ids, event.logprobs))
        if isinstance(event, Generated):
            part.text += event.chunk.text
            if event.chunk.logprobs is not None:
                part.entries += list(zip(event.chunk.token_ids, event.chunk.logprobs))
        elif isinstance(event, Finished):
            self.results[index] = event.result
        whole.text += part.text
        whole.entries += part.entries
        return part if part.text or part.entries else None


def _finite(value: float) -> float:
    return max(value, LOGPROB_FLOOR)
