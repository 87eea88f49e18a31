"""Prometheus metrics, in a registry of the app's own (two apps in one process, as in
the tests, must not share counters)."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class Metrics:
    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("specsample_requests", "HTTP requests answered", ["endpoint", "status"], registry=r)
        self.request_seconds = Histogram("specsample_request_seconds", "Time to answer a request, end of stream included",
                                         ["endpoint"], buckets=LATENCY_BUCKETS, registry=r)
        self.queue_wait_seconds = Histogram("specsample_queue_wait_seconds", "Time a request waited for the model",
                                            buckets=LATENCY_BUCKETS, registry=r)
        self.first_token_seconds = Histogram("specsample_time_to_first_token_seconds",
                                             "From the request's arrival to its first generated text",
                                             buckets=LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter("specsample_prompt_tokens", "Prompt tokens of finished generations", registry=r)
        self.completion_tokens = Counter("specsample_completion_tokens", "Tokens generated", registry=r)
        self.target_calls = Counter("specsample_target_calls", "Target model decoding calls", registry=r)
        self.drafted = Counter("specsample_draft_tokens", "Draft tokens proposed", registry=r)
        self.accepted = Counter("specsample_accepted_draft_tokens", "Draft tokens the target accepted", registry=r)
        self.acceptance = Histogram("specsample_acceptance_rate", "Per-request share of draft tokens accepted",
                                    buckets=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0), registry=r)
        self.cancelled = Counter("specsample_cancelled_generations", "Generations stopped: client gone or timed out",
                                 registry=r)
        self.batch_sequences = Histogram("specsample_batch_sequences", "Requests served by each target call",
                                         buckets=(1, 2, 3, 4, 6, 8, 12, 16), registry=r)
        self.batch_tokens = Histogram("specsample_batch_tokens", "Tokens scored by each target call (every request's)",
                                      buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512), registry=r)
        # Where the worker's time goes, by model, by how many requests a call served (at
        # most --parallel) and by phase: "prompt" for a call that took in a prompt's
        # chunk or the draft's catching up, "decode" for the rounds' own calls (bench
        # --serve reads these around each load).
        by_call = ["model", "sequences", "phase"]
        self.calls = Counter("specsample_model_calls", "Model calls, by model, requests each served and phase",
                             by_call, registry=r)
        self.call_tokens = Counter("specsample_model_call_tokens", "Tokens fed to model calls, by model, requests "
                                   "each served and phase", by_call, registry=r)
        self.call_seconds = Counter("specsample_model_call_seconds", "Seconds in model calls, by model, requests "
                                    "each served and phase", by_call, registry=r)
        self.depth = Gauge("specsample_queue_depth", "Requests waiting for the model", registry=r)
        self.active = Gauge("specsample_active_slots", "Requests being generated now", registry=r)
        self.busy = Gauge("specsample_worker_busy_seconds", "Seconds the worker spent generating (model calls and "
                          "each request's work between them), not waiting for requests", registry=r)
        self.slots = Gauge("specsample_slots", "Requests that may be generated at once (--parallel)", registry=r)

    def watch(self, worker) -> None:
        self.depth.set_function(lambda: worker.depth)
        self.active.set_function(lambda: worker.active)
        self.busy.set_function(lambda: worker.busy_seconds)
        self.slots.set(worker.parallel)
        if worker.prompt_cache is not None:
            self.registry.register(PromptCacheCollector(worker.prompt_cache))

    def call(self, target: bool, sequences: int, tokens: int, seconds: float, prompt: bool = False) -> None:
        """A model call the worker made (called from its thread); `prompt`: it took in
        text rather than scoring a round (batching.prompt_work)."""
        labels = ("target" if target else "draft", str(sequences), "prompt" if prompt else "decode")
        self.calls.labels(*labels).inc()
        self.call_tokens.labels(*labels).inc(tokens)
        self.call_seconds.labels(*labels).inc(seconds)
        if target:
            self.batch_sequences.observe(sequences)
            self.batch_tokens.observe(tokens)

    def finished(self, prompt_tokens: int, stats) -> None:
        self.prompt_tokens.inc(prompt_tokens)
        self.completion_tokens.inc(stats.new_tokens)
        self.target_calls.inc(stats.target_calls)
        self.drafted.inc(stats.drafted)
        self.accepted.inc(stats.accepted)
        if stats.acceptance_rate is not None:
            self.acceptance.observe(stats.acceptance_rate)


class CountRequests:
    """ASGI middleware: count every answer by endpoint and status, time it to its
    last byte (streams included). Unknown paths share one label, so a scanner
    cannot grow the label set. An answer begun but never finished counts as 499 (its
    client left, or was dropped for not reading: a stream's 200 went out first), or
    as 500 if the app raised."""

    def __init__(self, app, metrics: Metrics, endpoints: set[str]):
        self.app = app
        self.metrics = metrics
        self.endpoints = endpoints

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        endpoint = scope["path"] if scope["path"] in self.endpoints else "other"
        status, finished, failed = 500, False, True

        async def send_and_note(message):
            nonlocal status, finished
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                finished = True
            await send(message)

        start = time.perf_counter()
        try:
            await self.app(scope, receive, send_and_note)
            failed = False
        finally:
            if not finished:
                status = 500 if failed else 499
            self.metrics.requests.labels(endpoint, str(status)).inc()
            self.metrics.request_seconds.labels(endpoint).observe(time.perf_counter() - start)


class PromptCacheCollector:
    """The host prompt cache's counts (prompt_cache.py), read as they stand at each scrape:
    the cache is the worker thread's, which counts as it goes."""

    def __init__(self, cache):
        self.cache = cache

    def describe(self):
        return []  # no duplicate-name check at registration: collect() reads a live cache

    def collect(self):
        cache = self.cache
        for name, help_text, value in (
                ("specsample_prompt_cache_hits", "Prompts that found a longer start in the host prompt cache than "
                 "in their slot, restored into it", cache.hits),
                ("specsample_prompt_cache_reused_tokens", "Prompt tokens those restores spared scoring", cache.reused_tokens),
                ("specsample_prompt_cache_stored", "Slot texts copied into the host prompt cache", cache.stored),
                ("specsample_prompt_cache_evicted", "Entries evicted, least recently used first, to make room",
                 cache.evicted),
                ("specsample_prompt_cache_no_room", "Restores the model's cache had no room for (llama.cpp: no run "
                 "of free cells long enough); the prompt was scored whole", cache.no_room)):
            yield CounterMetricFamily(name, help_text, value=value)
        yield GaugeMetricFamily("specsample_prompt_cache_bytes", "Bytes the host prompt cache holds", value=cache.bytes)
        yield GaugeMetricFamily("specsample_prompt_cache_entries", "Texts the host prompt cache holds", value=len(cache))
