"""The OpenAI shapes of an answer: chat or text completion, whole or in chunks, with
n choices, log-probabilities and usage; llama-server's shape for /infill; and the
answer so far, built from the worker's events."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from ..backends.base import Tokenizer
from ..decoding.generate import GenerationResult
from ..output.logprobs import TokenLogprob
from ..output.tools import CallStart, Content, Delta, ToolFormat, ToolParser
from .editor import pick_fields
from .events import ChoiceEvent, Finished, Generated, PromptScored

FINISH_REASONS = {"length": "length", "eos": "stop", "stop_string": "stop", "grammar": "stop", "limit": "length"}
# JSON has no -inf: a token the controls removed ("processed" log-probabilities) gets
# this floor, as several OpenAI-compatible servers do.
LOGPROB_FLOOR = -9999.0


@dataclass
class Choice:
    """What one choice has produced so far (the whole answer's parts, or one chunk's)."""

    index: int
    text: str = ""
    entries: list[tuple[int, TokenLogprob | None]] = field(default_factory=list)  # None: a prompt's first token
    tokens: list[int] = field(default_factory=list)  # generated token ids (/infill's parts)


class Reply:
    done_marker = True  # a stream ends with data: [DONE]

    def __init__(self, chat: bool, model: str, prompt_tokens: int, drafter_name: str | None,
                 tokenizer: Tokenizer | None = None, logprobs: int | None = None, tools: ToolFormat | None = None,
                 tool_names: tuple[str, ...] = (), choices_per_prompt: int = 1):
        self.chat, self.model, self.prompt_tokens, self.drafter_name = chat, model, prompt_tokens, drafter_name
        self.choices_per_prompt = choices_per_prompt  # n: choice i answers prompt i // n
        self.tokenizer = tokenizer
        self.logprobs = logprobs  # None: none asked for; N: alternatives per token
        self.tools = tools if chat else None  # the format the answer's tool calls are read in; None: no calls
        self.tool_names = tool_names
        self._parsers: dict[int, ToolParser] = {}  # choice -> its stream's reader
        self._call_ids: dict[tuple[int, int], str] = {}  # (choice, call) -> the call's id
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

    def chunks(self, part: Choice) -> list[dict]:
        """A part as chunks: one, or with tools the content and tool-call deltas it tells."""
        if self.tools is None:
            return [self.chunk(part)]
        return self._delta_chunks(part, self._parser(part.index).feed(part.text))

    def end_chunks(self, index: int, finish_reason: str, results: dict[int, GenerationResult]) -> list[dict]:
        out = []
        if self.tools is not None:
            parser = self._parser(index)
            out = self._delta_chunks(Choice(index), parser.finish())
            # A call whose arguments went out unfinished ends the stream as "length".
            whole = parser.calls if not parser.calls or parser.calls[-1].finished else []
            finish_reason = self._finish(finish_reason, whole, parser.cut)
        return out + [self.chunk(Choice(index), finish_reason=finish_reason)]

    def _parser(self, index: int) -> ToolParser:
        if index not in self._parsers:
            self._parsers[index] = ToolParser(self.tools, self.tool_names)
        return self._parsers[index]

    def _delta_chunks(self, part: Choice, deltas: list[Delta]) -> list[dict]:
        """OpenAI's streamed tool calls: a call opens with its index, id, type and name
        (arguments ""), and its arguments follow in parts; the part's log-probabilities
        ride on its first chunk."""
        out = []
        for d in deltas:
            if isinstance(d, Content):
                delta = {"content": d.text}
            elif isinstance(d, CallStart):
                delta = {"tool_calls": [{"index": d.index, "id": self._call_id(part.index, d.index),
                                         "type": "function", "function": {"name": d.name, "arguments": ""}}]}
            else:
                delta = {"tool_calls": [{"index": d.index, "function": {"arguments": d.text}}]}
            out.append(self._wrap("chat.completion.chunk", [{"index": part.index, "delta": delta, "logprobs": None,
                                                             "finish_reason": None}]))
        if part.entries:
            if not out:
                out.append(self.chunk(Choice(part.index)))
            out[0]["choices"][0]["logprobs"] = self._logprobs(part)
        return out

    def _call_id(self, choice: int, call: int) -> str:
        if (choice, call) not in self._call_ids:
            self._call_ids[choice, call] = f"call_{uuid.uuid4().hex[:24]}"
        return self._call_ids[choice, call]

    @staticmethod
    def _finish(finish_reason: str, calls: list, cut: bool = False) -> str:
        """"tool_calls" for an answer with whole calls that ended after them, or was cut
        off (max_tokens) inside a further call, which it then leaves out."""
        return "tool_calls" if calls and (finish_reason == "stop" or finish_reason == "length" and cut) \
            else finish_reason

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
                message = self._message(index, part.text)
                parser = self._parser(index) if self.tools else None
                choices.append({"index": index, "message": message, "logprobs": logprobs,
                                "finish_reason": self._finish(finish, message.get("tool_calls") or [],
                                                              parser is not None and parser.cut)})
            else:
                choices.append({"index": index, "text": part.text, "logprobs": logprobs, "finish_reason": finish})
        return self._wrap("chat.completion" if self.chat else "text_completion", choices, usage=self.usage(results))

    def _message(self, index: int, text: str) -> dict:
        if self.tools is None:
            return {"role": "assistant", "content": text}
        parser = self._parser(index)
        content = "".join(d.text for d in parser.feed(text) + parser.finish() if isinstance(d, Content))
        # A call cut off by max_tokens has no JSON to give: only whole calls are answered.
        whole = [call for call in parser.calls if call.finished]
        if not whole:
            return {"role": "assistant", "content": content}
        calls = [{"id": self._call_id(index, j), "type": "function",
                  "function": {"name": call.name, "arguments": call.arguments}} for j, call in enumerate(whole)]
        return {"role": "assistant", "content": content or None, "tool_calls": calls}

    def usage(self, results: dict[int, GenerationResult]) -> dict:
        n = sum(len(r.token_ids) for r in results.values())
        # An extension: the speculative statistics (acceptance rate, tokens per target
        # call, accepted-per-round histogram, time split); one object per choice when
        # there are several.
        stats = [{"drafter": self.drafter_name, **results[i].stats.as_dict()} for i in sorted(results)]
        usage = {"prompt_tokens": self.prompt_tokens, "completion_tokens": n, "total_tokens": self.prompt_tokens + n}
        # OpenAI's count of prompt tokens a cache held (cache_prompt): each prompt's, as its
        # first choice found it (the later ones find it whole, as they follow on its slot);
        # 0 when none was, as OpenAI writes it (the openai client read None when it was left out).
        cached = sum(r.stats.cached_prompt_tokens for i, r in results.items() if i % self.choices_per_prompt == 0)
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
        return {**usage, "speculative": stats[0] if len(stats) == 1 else stats}

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


# GenerationResult.stop_reason -> llama-server's stop_type.
STOP_TYPES = {"length": "limit", "eos": "eos", "stop_string": "word", "grammar": "eos", "limit": "limit"}


class InfillReply:
    """llama-server's /completion shape, which its /infill answers in: one answer, as one
    object, or streamed as `{"content", "tokens", "stop": false}` parts and a last object
    with `"stop": true`, its stop_type and counts (no [DONE], as llama-server sends none
    outside its OpenAI endpoints)."""

    chat = False
    done_marker = False

    def __init__(self, model: str, prompt_tokens: int, drafter_name: str | None, fields: list[str] | None = None):
        self.model, self.prompt_tokens, self.drafter_name = model, prompt_tokens, drafter_name
        self.fields = fields  # response_fields: the last object's fields to send (editor.pick_fields)

    def chunk(self, part: Choice, finish_reason: str | None = None, role: bool = False) -> dict:
        return {"index": part.index, "content": part.text, "tokens": part.tokens, "stop": False}

    def chunks(self, part: Choice) -> list[dict]:
        return [self.chunk(part)]

    def end_chunks(self, index: int, finish_reason: str, results: dict[int, GenerationResult]) -> list[dict]:
        return [self._final(index, "", [], results[index])]

    def whole(self, parts: dict[int, Choice], results: dict[int, GenerationResult]) -> dict:
        (index, result), = results.items()
        return self._final(index, parts[index].text, result.token_ids, result)

    def _final(self, index: int, content: str, tokens: list[int], result: GenerationResult) -> dict:
        stats, n = result.stats, len(result.token_ids)
        prompt_seconds, predicted_seconds = stats.prefill_seconds, stats.total_seconds - stats.prefill_seconds
        scored = self.prompt_tokens - stats.cached_prompt_tokens
        body = {"index": index, "content": content, "tokens": tokens, "stop": True, "model": self.model,
                "stop_type": STOP_TYPES[result.stop_reason], "tokens_predicted": n,
                "tokens_evaluated": self.prompt_tokens, "truncated": False,
                # What the slot's cache holds at the end, for the next request's cache_prompt.
                "tokens_cached": self.prompt_tokens + n,
                # prompt_n: the prompt tokens scored; cache_n: those its slot held already.
                "timings": {"prompt_n": scored, "cache_n": stats.cached_prompt_tokens, "prompt_ms": prompt_seconds * 1000,
                            "prompt_per_token_ms": _per(prompt_seconds * 1000, scored),
                            "prompt_per_second": _per(scored, prompt_seconds),
                            "predicted_n": n, "predicted_ms": predicted_seconds * 1000,
                            "predicted_per_token_ms": _per(predicted_seconds * 1000, n),
                            "predicted_per_second": _per(n, predicted_seconds)},
                "speculative": {"drafter": self.drafter_name, **stats.as_dict()}}  # an extension, as in usage
        return pick_fields(body, self.fields)


def _per(amount: float, per: float) -> float:
    return amount / per if per > 0 else 0.0


class Answer:
    """The answer so far, from the worker's events: each event's part of its choice,
    and the whole of every choice."""

    def __init__(self, echoes: dict[int, tuple[list[int], str | None]], tokenizer: Tokenizer):
        self.echoes = echoes  # choice -> its prompt's ids and text, sent before the choice's first text
        self.tokenizer = tokenizer
        self.whole: dict[int, Choice] = {}
        self.results: dict[int, GenerationResult] = {}
        self._sent_tokens: dict[int, int] = {}  # choice -> its generated tokens already in a part

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
            whole.tokens += event.chunk.token_ids
            if event.chunk.logprobs is not None:
                part.entries += list(zip(event.chunk.token_ids, event.chunk.logprobs))
        elif isinstance(event, Finished):
            self.results[index] = event.result
        whole.text += part.text
        whole.entries += part.entries
        if not (part.text or part.entries):
            return None
        # The tokens since the last part sent (a token whose text waits for the next one's
        # characters comes with that one).
        part.tokens = whole.tokens[self._sent_tokens.get(index, 0):]
        self._sent_tokens[index] = len(whole.tokens)
        return part


def _finite(value: float) -> float:
    return max(value, LOGPROB_FLOOR)
