"""A bounded serving load: C concurrent streaming clients send R requests to an
OpenAI-compatible server, and we time what each client sees.

The client is the official `openai` package, as a user's would be. The servers the
research bench starts get token ids as the prompt of /v1/completions, so every server
decodes the very same tokens; an endpoint of `bench serve --url` gets text, on
/v1/chat/completions (a body with `messages`) or /v1/completions. Every figure comes
from the client's clock alone, so it means the same for every server: neither our
`usage` nor llama-server's `timings` can split the time of a call that served several
requests between them. Only the token count is the server's: the stream's closing
`usage` (stream_options.include_usage); a stream without one is counted lost, not
guessed at. The figures (TTFT, TPOT, ITL, tokens/s, decode tokens/s, outcomes) are
defined where the report states them, serve_summary.SERVE_NOTE. Why decode tokens/s
divides by the decode span (decode_span): an answer's first token comes out of its
prompt's prefill, so it and the wait before it count in TTFT; with one request at a
time the span is sum(last - first), the per-sequence bench's decode time, and with
several a newcomer's prefill that runs while others stream stays in (it slows them, a
cost batching pays).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from .records import RequestTiming, ServedRecord
from .stats import percentile


@dataclass
class LoadSummary:
    """One load (one server, slot count, client count, task and setting) as a whole."""

    requests: int  # sent
    answered: int
    refused: dict[int, int]  # HTTP status -> requests answered with it instead of a completion
    lost: int
    wall_seconds: float
    completion_tokens: int  # of the answered requests
    decode_tokens: int  # the same, less each answer's first token
    decode_seconds: float  # the decode span: see decode_span
    ttft: list[float]
    tpot: list[float]
    itl: list[float]
    drafted: int
    accepted: int

    @property
    def tokens_per_second(self) -> float:
        return self.completion_tokens / self.wall_seconds if self.wall_seconds else 0.0

    @property
    def requests_per_second(self) -> float:
        return self.answered / self.wall_seconds if self.wall_seconds else 0.0

    @property
    def decode_tokens_per_second(self) -> float | None:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds else None

    @property
    def tokens_per_answer(self) -> float | None:
        return self.completion_tokens / self.answered if self.answered else None

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    def quantile(self, name: str, q: float) -> float | None:
        values = getattr(self, name)
        return percentile(values, q) if values else None


def summarise_load(timings: list[RequestTiming], wall_seconds: float) -> LoadSummary:
    ok = [t for t in timings if t.outcome == "answered"]
    refused: dict[int, int] = {}
    for t in timings:
        if t.outcome == "refused":
            refused[t.status] = refused.get(t.status, 0) + 1
    streamed = [t for t in ok if t.decoding is not None]
    return LoadSummary(
        requests=len(timings), answered=len(ok), refused=dict(sorted(refused.items())),
        lost=sum(t.outcome == "lost" for t in timings), wall_seconds=wall_seconds,
        completion_tokens=sum(t.completion_tokens for t in ok),
        decode_tokens=sum(max(t.completion_tokens - 1, 0) for t in streamed),
        decode_seconds=decode_span([t.decoding for t in streamed]),
        ttft=[t.first_text for t in ok if t.first_text is not None],
        tpot=[t.tpot for t in ok if t.tpot is not None],
        itl=[g for t in ok for g in t.chunk_gaps],
        drafted=sum(t.drafted for t in ok), accepted=sum(t.accepted for t in ok),
    )


def decode_span(intervals: list[tuple[float, float]]) -> float:
    """Seconds during which at least one answer was streaming: the length of the union
    of the (first text, last text) intervals. [(0, 2), (1, 3), (5, 6)] -> 3 + 1 = 4."""
    total, end = 0.0, float("-inf")
    for lo, hi in sorted(intervals):
        if hi > end:
            total += hi - max(lo, end)
            end = hi
    return total


def run_load(api_base: str, bodies: list[dict], concurrency: int, api_key: str = "none",
             timeout: float = 3600.0) -> tuple[list[RequestTiming], float]:
    """Send every body (a /v1/completions request, or a /v1/chat/completions one where
    it has `messages`, without `stream`) to the API at `api_base` (".../v1") from
    `concurrency` clients, each taking the next body when its previous answer ends.
    Returns the timings in body order and the wall time from the first send to the
    last answer."""
    return asyncio.run(_load(api_base, bodies, concurrency, api_key, timeout))


async def _load(api_base, bodies, concurrency, api_key, timeout):
    import httpx
    from openai import AsyncOpenAI

    # A new connection per request: a kept-alive one that the server closed while it
    # sat idle (llama-server closes them after 5 s) fails the next request sent on it.
    http = httpx.AsyncClient(limits=httpx.Limits(max_keepalive_connections=0), timeout=timeout)
    client = AsyncOpenAI(base_url=api_base, api_key=api_key, timeout=timeout, max_retries=0, http_client=http)
    pending = list(enumerate(bodies))[::-1]
    timings: list[RequestTiming] = []
    start = time.perf_counter()

    async def client_loop():
        while pending:
            index, body = pending.pop()
            timings.append(await _one(client, index, body, start))

    try:
        await asyncio.gather(*(client_loop() for _ in range(max(1, concurrency))))
    finally:
        await client.close()
    return sorted(timings, key=lambda t: t.index), time.perf_counter() - start


async def _one(client, index: int, body: dict, start: float) -> RequestTiming:
    from openai import APIStatusError

    sent = time.perf_counter()
    timing = RequestTiming(index, sent - start, None, 0.0, 0)
    last = None
    body = dict(body)
    chat = "messages" in body
    known = {k: body.pop(k) for k in ("model", "prompt", "messages", "max_tokens", "temperature", "top_p", "stop",
                                      "seed") if k in body}
    usage = None
    try:
        create = client.chat.completions.create if chat else client.completions.create
        stream = await create(**known, stream=True, stream_options={"include_usage": True}, extra_body=body)
        async for chunk in stream:
            now = time.perf_counter()
            text = _text(chunk, chat)
            if text:
                if timing.first_text is None:
                    timing.first_text = now - sent
                else:
                    timing.chunk_gaps.append(now - last)
                last = now
                timing.text += text
            if chunk.choices and chunk.choices[0].finish_reason:
                timing.finish_reason = chunk.choices[0].finish_reason
            if chunk.usage is not None:
                usage = chunk.usage
                timing.completion_tokens = usage.completion_tokens
                timing.drafted, timing.accepted = _draft_counts(chunk)
    except APIStatusError as e:  # the server said no, with a status: a refusal
        timing.status, timing.error = e.status_code, f"{type(e).__name__}: {e}"
    except Exception as e:  # a lost request is counted, not fatal to the load
        timing.error = f"{type(e).__name__}: {e}"
    if timing.error is None and timing.finish_reason is None:
        timing.error = "the stream ended without a finish reason"
    elif timing.error is None and usage is None:  # no count of its tokens: none of its figures would hold
        timing.error = "the stream carried no usage (stream_options.include_usage)"
    timing.finished = (last or time.perf_counter()) - sent
    return timing


def _text(chunk, chat: bool) -> str | None:
    """The text a chunk streams: a chat chunk's content delta, a completion's text."""
    if not chunk.choices:
        return None
    return chunk.choices[0].delta.content if chat else chunk.choices[0].text


def _draft_counts(chunk) -> tuple[int, int]:
    """Drafted and accepted tokens from our usage extension or llama-server's timings."""
    ours = (chunk.usage.model_extra or {}).get("speculative") or {}
    if ours:
        return ours.get("drafted", 0), ours.get("accepted", 0)
    timings = (chunk.model_extra or {}).get("timings") or {}
    return timings.get("draft_n", 0), timings.get("draft_n_accepted", 0)


@dataclass
class Load:
    """What every server is asked: the prompts of each task, sent under each setting
    from each client count; `new_tokens(task)` is the answer limit."""

    prompts: dict  # task -> [runner.PreparedPrompt]
    settings: tuple[str, ...]
    clients: tuple[int, ...]
    new_tokens: Callable[[str], int]
    repeats: int = 1  # times each load is sent to every server

    def rounds(self, turns: list) -> list[tuple[int, tuple, list]]:
        """(repeat, (clients, task, setting), turns in this round's order) for every
        round: all loads once per pass, --repeats passes, the order rotating by one
        from round to round."""
        loads = [(clients, task, setting) for clients in self.clients for task in self.prompts
                 for setting in self.settings]
        return [(repeat, one, rotation(turns, repeat * len(loads) + i))
                for repeat in range(self.repeats) for i, one in enumerate(loads)]


def rotation(items: list, i: int) -> list:
    """items started at position i (mod their number): [A, B, C] at 1 -> [B, C, A]."""
    if not items:
        return []
    i %= len(items)
    return items[i:] + items[:i]


def unanswered_notes(records: list[ServedRecord]) -> list[str]:
    """A note per load in which a request went unanswered: how many were refused (by
    status) and lost, and the first error."""
    loads: dict[tuple, list[ServedRecord]] = {}
    for r in records:
        loads.setdefault((r.mode, r.slots, r.clients, r.task, r.setting, r.repeat), []).append(r)
    notes = []
    for (mode, slots, clients, task, setting, repeat), group in loads.items():
        failed = [r.timing for r in group if r.timing.outcome != "answered"]
        if failed:
            statuses = ", ".join(str(t.status) for t in failed if t.status is not None) or "none"
            where = ", ".join([mode, *([f"{slots} slots"] if slots is not None else []), f"{clients} clients",
                               f"{task} {setting}", *([f"repeat {repeat + 1}"] if repeat is not None else [])])
            notes.append(f"{where}: {len(failed)} of {len(group)} requests not answered (statuses: {statuses}); "
                         f"first: {failed[0].error}")
    return notes
