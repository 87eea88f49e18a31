"""What `specsample serve` was started with, and what every route shares."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..backends.base import Backend
from ..control import Policy
from ..drafters import Drafter
from ..sampling import SamplingConfig
from .metrics import Metrics
from .worker import Worker


@dataclass
class Settings:
    model_name: str  # the id clients pass as "model"
    k: int | str = "auto"  # draft tokens per round, or "auto"
    k_max: int = 8  # the most drafts "auto" proposes in a round
    policy: Policy | None = None  # one adaptive controller for all requests (keeps its measurements)
    api_key: str | None = None
    max_queue: int = 16  # requests waiting for the model; one more gets 429
    queue_timeout: float = 120.0  # seconds a request may wait for the model
    max_body_bytes: int = 1 << 20
    max_tokens: int = 1024  # cap on max_tokens per request, and its default
    max_request_tokens: int | None = None  # cap on a request's tokens, all choices and echo; None: 8 x max_tokens
    verifier: str = "auto"  # GenerationConfig.verifier for every request

    @property
    def request_budget(self) -> int:
        """Eight full-length choices by default: a request's n and prompts share one budget."""
        return self.max_request_tokens or 8 * self.max_tokens


@dataclass
class Server:
    target: Backend  # with a tokenizer
    make_drafter: Callable[[SamplingConfig], Drafter | None]  # a request's drafter, drawing from its sampling
    drafter_name: str | None
    settings: Settings
    worker: Worker
    metrics: Metrics
