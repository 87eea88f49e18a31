"""The single worker that owns the models: one generation at a time, in a thread.

The KV caches are single-sequence, so requests take turns. Each waits in a FIFO
queue of at most max_queue live requests; the worker runs `stream` for it and hands
every chunk back to the event loop that is answering it (`loop.call_soon_threadsafe`),
so the loop never blocks on a model. A request whose client went away is cancelled:
the worker stops iterating its Stream at the next round and moves on.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..drafters import Drafter
from ..generate import GenerationConfig, GenerationResult, GenerationStats, stream
from ..logprobs import score_prompt
from .events import End, Ended, Event, Finished, Generated, PromptScored, Started


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
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)  # in the order events.py gives
    cancelled: threading.Event = field(default_factory=threading.Event)
    enqueued_at: float = field(default_factory=time.monotonic)
    started: bool = False  # Started was sent

    def emit(self, event: Event) -> None:
        """Called from the worker thread."""
        self.loop.call_soon_threadsafe(self.events.put_nowait, event)

    def start(self) -> None:
        if not self.started:
            self.started = True
            self.emit(Started())

    def cancel(self) -> None:
        self.cancelled.set()


class _Cancelled(Exception):
    pass


def _stop_if_cancelled(job: Job) -> None:
    if job.cancelled.is_set():
        raise _Cancelled


class Worker:
    def __init__(self, target, max_queue: int, policy=None):
        self.target = target
        self.policy = policy  # kept across requests (control.make_policy); None: each stream makes its own
        self.max_queue = max_queue
        self._waiting: collections.deque[Job] = collections.deque()
        self._changed = threading.Condition()  # guards _waiting and _stopping
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="specsample-worker", daemon=True)
        self.busy = False

    @property
    def depth(self) -> int:
        """Requests waiting, not counting the one being generated nor those cancelled."""
        with self._changed:
            return sum(not job.cancelled.is_set() for job in self._waiting)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        with self._changed:
            for job in self._waiting:
                job.cancel()
            self._waiting.clear()
            self._stopping = True
            self._changed.notify()
        self._thread.join(timeout)

    def submit(self, job: Job) -> None:
        with self._changed:
            # A request that timed out or whose client left while waiting holds no
            # place: without this, --max-queue of them would turn everyone away.
            self._drop_cancelled()
            if len(self._waiting) >= self.max_queue:
                raise QueueFull
            self._waiting.append(job)
            self._changed.notify()

    def _drop_cancelled(self) -> None:
        for job in [j for j in self._waiting if j.cancelled.is_set()]:
            self._waiting.remove(job)
            job.emit(Ended(End.CANCELLED))

    def _next(self) -> Job | None:
        """The next job, waiting for one; None once stopped."""
        with self._changed:
            while not self._waiting and not self._stopping:
                self._changed.wait()
            return None if self._stopping else self._waiting.popleft()

    def _run(self) -> None:
        while (job := self._next()) is not None:
            if job.cancelled.is_set():  # timed out or disconnected while waiting
                job.emit(Ended(End.CANCELLED))
                continue
            self.busy = True
            try:
                self._generate(job)
            finally:
                self.busy = False

    def _generate(self, job: Job) -> None:
        # Every job ends with exactly one Ended. A task's checks (stream()'s) come
        # before any model call for it, so a refusal is told apart by where it was
        # raised, and the first task's comes before Started, while a stream can still
        # answer with a 400.
        try:
            drafter = None
            for task in job.tasks:
                # Asked between tasks, between scoring calls and before a generation
                # starts as well as between rounds: a client that left holds the
                # model for one call at most, whatever it asked for.
                _stop_if_cancelled(job)
                s = None
                if task.config is not None:
                    drafter = drafter or job.make_drafter()
                    try:
                        s = stream(self.target, task.prompt_ids, task.config, drafter, self.policy)  # checks the request
                    except ValueError as e:
                        job.emit(Ended(End.REFUSED, e))
                        return
                job.start()
                if task.prompt_logprobs is not None:
                    scored = score_prompt(self.target, task.prompt_ids, task.prompt_logprobs,
                                          cancelled=job.cancelled.is_set)
                    _stop_if_cancelled(job)  # scored is None then
                    job.emit(PromptScored(task.index, scored))
                _stop_if_cancelled(job)  # before the prefill
                if s is None:
                    job.emit(Finished(task.index, GenerationResult([], "", GenerationStats(), "length")))
                    continue
                for chunk in s:
                    job.emit(Generated(task.index, chunk))
                    # Before computing the next round; the next job starts with a
                    # rollback: nothing to clean up.
                    _stop_if_cancelled(job)
                job.emit(Finished(task.index, s.result))
        except _Cancelled:
            job.emit(Ended(End.CANCELLED))
            return
        except Exception as e:  # reported to the request; the worker keeps serving
            job.emit(Ended(End.FAILED, e))
            return
        job.emit(Ended(End.DONE))
