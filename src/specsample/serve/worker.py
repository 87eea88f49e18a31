"""The single worker that owns the models: one generation at a time, in a thread.

The KV caches are single-sequence, so requests take turns. Each waits in a bounded
FIFO queue; the worker runs `stream` for it and hands every chunk back to the event
loop that is answering it (`loop.call_soon_threadsafe`), so the loop never blocks on a
model. A request whose client went away is cancelled: the worker stops iterating its
Stream at the next round and moves on.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..drafters import Drafter, HybridDrafter, ModelDrafter
from ..generate import GenerationConfig, GenerationResult, GenerationStats, stream
from ..logprobs import score_prompt
from ..sampling import SamplingConfig


class QueueFull(Exception):
    pass


@dataclass
class Task:
    """One choice of a request: a prompt and what to do with it."""

    index: int  # the choice's index in the response
    prompt_ids: list[int]
    config: GenerationConfig | None  # None: no generation (echo with max_tokens 0)
    prompt_logprobs: int | None = None  # score the prompt first, with this many alternatives per token


@dataclass
class Job:
    tasks: list[Task]  # run in turn: n samples of each prompt
    make_drafter: Callable[[], Drafter | None]  # built in the worker: a ModelDrafter follows the request's sampling
    loop: asyncio.AbstractEventLoop
    # ("started", None), then per task ("prompt", (index, log-probabilities)) and
    # ("chunk", (index, Chunk)) events and one ("result", (index, GenerationResult)),
    # then ("done", None); or ("error", exception) / ("cancelled", None) at any point.
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    enqueued_at: float = field(default_factory=time.monotonic)

    def emit(self, kind: str, value=None) -> None:
        """Called from the worker thread."""
        self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))

    def cancel(self) -> None:
        self.cancelled.set()


class Worker:
    def __init__(self, target, max_queue: int, policy=None):
        self.target = target
        self.policy = policy  # for -k auto; None: each stream makes its own from the config
        self._queue: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self._thread = threading.Thread(target=self._run, name="specsample-worker", daemon=True)
        self.busy = False

    @property
    def depth(self) -> int:
        """Requests waiting, not counting the one being generated."""
        return self._queue.qsize()

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        for job in self._drain():
            job.cancel()
        self._queue.put(None)  # the queue was just drained, so there is room
        self._thread.join(timeout)

    def submit(self, job: Job) -> None:
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            raise QueueFull from None

    def _drain(self) -> list[Job]:
        jobs = []
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return jobs
            if job is not None:
                jobs.append(job)

    def _run(self) -> None:
        while (job := self._queue.get()) is not None:
            if job.cancelled.is_set():  # timed out or disconnected while waiting
                job.emit("cancelled")
                continue
            self.busy = True
            try:
                self._generate(job)
            finally:
                self.busy = False

    def _generate(self, job: Job) -> None:
        # Every job ends with exactly one of "done", "error" or "cancelled".
        try:
            drafter, started = None, False
            for task in job.tasks:
                if task.prompt_logprobs is not None:
                    scored = score_prompt(self.target, task.prompt_ids, task.prompt_logprobs)
                    started = started or _started(job)
                    job.emit("prompt", (task.index, scored))
                if task.config is None:
                    started = started or _started(job)
                    job.emit("result", (task.index, GenerationResult([], "", GenerationStats(), "length")))
                    continue
                drafter = drafter or job.make_drafter()
                policy = self.policy if task.config.k == "auto" else None
                s = stream(self.target, task.prompt_ids, task.config, drafter, policy)  # checks the request
                started = started or _started(job)
                for chunk in s:
                    job.emit("chunk", (task.index, chunk))
                    if job.cancelled.is_set():  # before computing the next round
                        job.emit("cancelled")  # the next job starts with a rollback: nothing to clean up
                        return
                job.emit("result", (task.index, s.result))
        except Exception as e:  # reported to the request; the worker keeps serving
            job.emit("error", e)
            return
        job.emit("done")


def _started(job: Job) -> bool:
    job.emit("started")
    return True


def drafter_factory(drafter: Drafter | None) -> Callable[[SamplingConfig], Drafter | None]:
    """Drafters per request: a ModelDrafter must draw from the request's own sampling
    distribution (or acceptance would be wrong), so it is rebuilt around the loaded
    draft backend, which is cheap; the others have no sampling and are shared."""
    if isinstance(drafter, ModelDrafter):
        return lambda sampling: ModelDrafter(drafter.backend, sampling)
    if isinstance(drafter, HybridDrafter):
        return lambda sampling: HybridDrafter(ModelDrafter(drafter.model.backend, sampling), drafter.ngram)
    return lambda sampling: drafter
