"""What the worker tells the request it is running, in order: Started once its first
task passed stream()'s checks, then per choice a PromptScored (echo), Generated chunks
and one Finished, then exactly one Ended. Each is sent from the worker thread to the
request's event loop."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ..decoding.generate import Chunk, GenerationResult
from ..output.logprobs import TokenLogprob


@dataclass(frozen=True)
class Started:
    """The worker took the job and stream() accepted it: it left the queue."""


@dataclass(frozen=True)
class PromptScored:
    index: int  # the choice
    logprobs: list[TokenLogprob | None]  # one per prompt token; None for the first, which nothing predicts


@dataclass(frozen=True)
class Generated:
    index: int
    chunk: Chunk


@dataclass(frozen=True)
class Finished:
    index: int
    result: GenerationResult


class End(enum.Enum):
    DONE = "done"  # every task finished
    REFUSED = "refused"  # stream() refused a task before any round: the request's fault
    FAILED = "failed"  # anything else raised: the engine's (or ours)
    CANCELLED = "cancelled"  # the client left or timed out; nobody is listening


@dataclass(frozen=True)
class Ended:
    end: End
    error: Exception | None = None  # for REFUSED and FAILED


ChoiceEvent = PromptScored | Generated | Finished
Event = Started | ChoiceEvent | Ended
