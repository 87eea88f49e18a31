"""What `specsample serve` was started with, and what every route shares."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio

from ..backends.base import Backend
from ..decoding.drafters import Drafter
from ..decoding.sampling import SamplingConfig
from ..policy.make import PolicyLike, check_draft_length
from .metrics import Metrics
from .prompt_cache import DEFAULT_MIB
from .worker import Worker

# What requests in flight get on SIGINT/SIGTERM to finish, before they are ended with a
# 503 (connections.py); uvicorn cancels what still runs a second later.
SHUTDOWN_SECONDS = 2


@dataclass
class Settings:
    model_name: str  # the id clients pass as "model"
    # The draft-length policy, forked for each slot (the forks share the measured costs);
    # or K, or "auto": create_app makes it (policy/make.as_policy), timed on the models at start.
    policy: PolicyLike = "auto"
    parallel: int = 1  # requests generated at once, in one target call per round (slots)
    api_key: str | None = None  # None: no key; an empty one is refused (it would be no key, silently)
    allowed_hosts: tuple[str, ...] | None = ()  # Host names served besides loopback ones; None: any
    max_queue: int = 16  # requests waiting for the model; one more gets 429
    queue_timeout: float = 120.0  # seconds a request may wait for the model
    max_body_bytes: int = 1 << 20
    max_tokens: int = 1024  # cap on max_tokens per request, and its default
    max_request_tokens: int | None = None  # cap on a request's tokens, all choices and echo; None: 8 x max_tokens
    verifier: str = "auto"  # GenerationConfig.verifier for every request
    cache_prompt: bool = True  # GenerationConfig.cache_prompt for requests that do not say (serve --no-cache-prompt)
    # Host memory for texts the slots held before a request replaced them, restored for a
    # later request that starts with more of one (prompt_cache.py); 0: none.
    prompt_cache_mib: int = DEFAULT_MIB
    body_timeout: float = 30.0  # seconds a request body may take to arrive (408 after)
    tokenizer_threads: int = field(default_factory=lambda: tokenizer_threads())  # tokenizing off the queue

    def __post_init__(self):
        check_api_key(self.api_key)
        if isinstance(self.policy, (int, str)):
            check_draft_length(self.policy)
        if self.tokenizer_threads < 1:
            raise ValueError(f"tokenizer_threads must be at least 1, got {self.tokenizer_threads}")
        if self.parallel < 1:
            raise ValueError(f"parallel must be at least 1, got {self.parallel}")
        if self.prompt_cache_mib < 0:
            raise ValueError(f"prompt_cache_mib must be at least 0, got {self.prompt_cache_mib}")

    @property
    def request_budget(self) -> int:
        """Eight full-length choices by default: a request's n and prompts share one budget."""
        return self.max_request_tokens or 8 * self.max_tokens


def check_api_key(key: str | None) -> None:
    """The one rule for a key: none, or not empty (an empty one would let every request in)."""
    if key is not None and not key.strip():
        raise ValueError("the API key is empty: give a non-empty key, or none to serve without one")


def tokenizer_threads() -> int:
    """Threads that may tokenize at once outside the worker's queue: one on a small
    machine, two at most, so a flood of /tokenize calls leaves the worker its cores."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return 1 if cores < 4 else 2


@dataclass
class Server:
    target: Backend  # with a tokenizer
    # make_drafter(sampling, draft_slot, cache_salt): a request's drafter, drawing from its
    # sampling, on its slot, drafting from what was served under its salt alone
    make_drafter: Callable[[SamplingConfig, Backend | None, str | None], Drafter | None]
    drafter_name: str | None
    settings: Settings
    worker: Worker
    metrics: Metrics
    tokenizing: anyio.CapacityLimiter | None = None  # of settings.tokenizer_threads; made in the app's lifespan
