"""A bounded serving load: C concurrent streaming clients send R requests to an
OpenAI-compatible server, and we time what each client sees.

The client is the official `openai` package, as a user's would be; requests carry
token ids (both our server and llama-server accept them), so every server decodes
the very same tokens.

What is measured, per request (all from the client's clock):
- TTFT: from sending the request to the first streamed text. Under load it includes
  the time spent waiting in the server's queue: that is what a user waits.
- TPOT (time per output token): (last text - first text) / (tokens - 1), the
  decode pace of that request once it started. tokens is the server's own count
  (`usage.completion_tokens`).
- ITL: gaps between successive streamed chunks. A speculative round streams several
  tokens in one chunk, so its gaps are longer and fewer than plain decoding's; ITL
  is how jerky the stream looks, TPOT how fast it goes.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from .stats import percentile


@dataclass
class RequestTiming:
    index: int
    sent: float  # seconds since the load started
    first_text: float | None  # seconds after `sent`
    finished: float  # seconds after `sent`
    completion_tokens: int
    chunk_gaps: list[float] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    drafted: int = 0
    accepted: int = 0
    error: str | None = None

    @property
    def tpot(self) -> float | None:
        if self.first_text is None or self.completion_tokens < 2:
            return None
        return (self.finished - self.first_text) / (self.completion_tokens - 1)


@dataclass
class LoadSummary:
    requests: int
    errors: int
    concurrency: int
    wall_seconds: float
    completion_tokens: int
    ttft: list[float]
    tpot: list[float]
    itl: list[float]
    drafted: int
    accepted: int

    @property
    def requests_per_second(self) -> float:
        return self.requests / self.wall_seconds if self.wall_seconds else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.completion_tokens / self.wall_seconds if self.wall_seconds else 0.0

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    def quantile(self, name: str, q: float) -> float | None:
        values = getattr(self, name)
        return percentile(values, q) if values else None


def summarise_load(timings: list[RequestTiming], concurrency: int, wall_seconds: float) -> LoadSummary:
    ok = [t for t in timings if t.error is None]
    return LoadSummary(
        requests=len(ok), errors=len(timings) - len(ok), concurrency=concurrency, wall_seconds=wall_seconds,
        completion_tokens=sum(t.completion_tokens for t in ok),
        ttft=[t.first_text for t in ok if t.first_text is not None],
        tpot=[t.tpot for t in ok if t.tpot is not None],
        itl=[g for t in ok for g in t.chunk_gaps],
        drafted=sum(t.drafted for t in ok), accepted=sum(t.accepted for t in ok),
    )


def run_load(base_url: str, bodies: list[dict], concurrency: int, api_key: str = "none",
             timeout: float = 3600.0) -> tuple[list[RequestTiming], float]:
    """Send every body (a /v1/completions request without `stream`) from `concurrency`
    clients, each taking the next body when its previous answer ends. Returns the
    timings in body order and the wall time from the first send to the last answer."""
    return asyncio.run(_load(base_url, bodies, concurrency, api_key, timeout))


async def _load(base_url, bodies, concurrency, api_key, timeout):
    import httpx
    from openai import AsyncOpenAI

    # A new connection per request: a kept-alive one that the server closed while it
    # sat idle (llama-server closes them after 5 s) fails the next request sent on it.
    http = httpx.AsyncClient(limits=httpx.Limits(max_keepalive_connections=0), timeout=timeout)
    client = AsyncOpenAI(base_url=f"{base_url}/v1", api_key=api_key, timeout=timeout, max_retries=0, http_client=http)
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
    sent = time.perf_counter()
    timing = RequestTiming(index, sent - start, None, 0.0, 0)
    last = None
    body = dict(body)
    known = {k: body.pop(k) for k in ("model", "prompt", "max_tokens", "temperature", "top_p", "stop", "seed")
             if k in body}
    try:
        stream = await client.completions.create(**known, stream=True, stream_options={"include_usage": True},
                                                 extra_body=body)
        async for chunk in stream:
            now = time.perf_counter()
            if chunk.choices and chunk.choices[0].text:
                if timing.first_text is None:
                    timing.first_text = now - sent
                else:
                    timing.chunk_gaps.append(now - last)
                last = now
                timing.text += chunk.choices[0].text
            if chunk.choices and chunk.choices[0].finish_reason:
                timing.finish_reason = chunk.choices[0].finish_reason
            if chunk.usage is not None:
                timing.completion_tokens = chunk.usage.completion_tokens
                timing.drafted, timing.accepted = _draft_counts(chunk)
    except Exception as e:  # a failed request is counted, not fatal to the load
        timing.error = f"{type(e).__name__}: {e}"
    timing.finished = (last or time.perf_counter()) - sent
    return timing


def _draft_counts(chunk) -> tuple[int, int]:
    """Drafted and accepted tokens from our usage extension or llama-server's timings."""
    ours = (chunk.usage.model_extra or {}).get("speculative") or {}
    if ours:
        return ours.get("drafted", 0), ours.get("accepted", 0)
    timings = (chunk.model_extra or {}).get("timings") or {}
    return timings.get("draft_n", 0), timings.get("draft_n_accepted", 0)
