"""The single worker that owns the models: up to `parallel` generations at once, in
one thread.

Each request waits in a FIFO queue of at most max_queue live requests until a slot
(one sequence of the models' caches) is free; then it runs `stream` on its slot, in a
sequence of the batch scheduler (batching.py), which makes one target call per
round for every request being generated (continuous batching: requests join and
leave between calls, admitted by admission.py's loop with this module's policy).
Every chunk is handed back to the event loop that is answering the request
(`loop.call_soon_threadsafe`), so the loop never blocks on a model. A request
whose client went away is cancelled: its sequence stops at its next round and frees
its slot.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..backends.base import Backend, common_prefix_length
from ..decoding.admission import Admission
from ..decoding.batching import Cancelled, Scheduler, scheduled, slots
from ..decoding.drafters import Drafter
from ..decoding.generate import GenerationConfig, GenerationResult, GenerationStats, stream
from ..output.logprobs import score_prompt
from .events import End, Ended, Event, Finished, Generated, PromptScored, Started
from .prompt_cache import PromptCache, before_prompt, keep

log = logging.getLogger("specsample.serve")


class QueueFull(Exception):
    pass


class SlotBusy(Exception):
    pass


class ShuttingDown(Exception):
    """The server is stopping: a request or erase asked now is never served (a 503)."""


class TargetLost(Exception):
    """The target can no longer be called (its RPC worker died mid-call, rpc.py): every
    request gets this, as a 503, until the server is started again."""


@dataclass
class ChoiceTask:
    """One choice of a request: a prompt and what to do with it."""

    index: int  # the choice's index in the response
    prompt_ids: list[int]
    config: GenerationConfig | None  # None: no generation (echo with max_tokens 0)
    prompt_logprobs: int | None = None  # score the prompt first, with this many alternatives per token
    warm: bool = False  # without a config: put the prompt into the slot's cache (a warm-up for cache_prompt)

    @property
    def cache_prompt(self) -> bool:
        return self.warm if self.config is None else self.config.cache_prompt


@dataclass
class QueuedRequest:
    choices: list[ChoiceTask]  # n samples of each prompt, spread over the slots free when it starts, taken in turn
    # make_drafter(draft_slot), built in the worker on the request's slot of the draft
    # model (None: lookup alone or none): a ModelDrafter follows the request's sampling.
    make_drafter: Callable[[Backend | None], Drafter | None]
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)  # in the order events.py gives
    cancelled: threading.Event = field(default_factory=threading.Event)
    enqueued_at: float = field(default_factory=time.monotonic)
    started: bool = False  # Started was sent
    # vLLM's cache_salt: a slot's cache is reused only by a request with the same salt
    # as the one that filled it (None is a salt too: unsalted requests share).
    cache_salt: str | None = None
    # The worker thread's own: tasks handed out, slots serving it, and its end if one
    # of them ended it early (the others are cancelled, and it is sent once all stop).
    taken: int = 0
    parts: int = 1  # set by the worker as it admits the job
    outcome: Ended | None = None

    def take(self) -> ChoiceTask | None:
        """The next task not yet begun on any slot."""
        if self.taken == len(self.choices):
            return None
        self.taken += 1
        return self.choices[self.taken - 1]

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


def _stop_if_cancelled(job: QueuedRequest) -> None:
    if job.cancelled.is_set():
        raise _Cancelled


class Worker:
    def __init__(self, target, max_queue: int, policy=None, draft=None, parallel: int = 1, on_call=None,
                 prompt_cache_bytes: int = 0):
        """`target` and `draft` (None: no draft model) hold at least `parallel`
        sequences (backends loaded with sequences=N); `policy` is forked for each slot
        (control.py), so each keeps its own state across the requests it serves and
        all share the machine's costs (K: a FixedK per request; create_app makes "auto");
        `on_call(target, sequences, tokens, seconds, prompt)` hears of every model call (metrics; batching.Scheduler);
        `prompt_cache_bytes`: host memory for the slots' earlier texts (prompt_cache.py;
        0, or a target that cannot copy its cache out: none)."""
        if not 1 <= parallel <= target.sequences:
            raise ValueError(f"--parallel {parallel}: the target holds {target.sequences} sequences")
        if draft is not None and draft.sequences < parallel:
            raise ValueError(f"--parallel {parallel}: the draft model holds {draft.sequences} sequences")
        self.target = target
        self.parallel = parallel
        self.slots = slots(target)[:parallel]
        self.draft_slots = slots(draft)[:parallel] if draft is not None else [None] * parallel
        if policy is None or isinstance(policy, int) or parallel == 1:
            policies = [policy] * parallel
        else:
            policies = [policy.fork() for _ in range(parallel)]
        self.policies = [scheduled(p) for p in policies]  # a planner's seats plan through the scheduler
        self.max_queue = max_queue
        self.scheduler = Scheduler(target, on_call=on_call)
        self.admission = Admission(self.scheduler, parallel)  # its free slots: only the worker thread changes them
        self._salts: list[str | None] = [None] * parallel  # the cache_salt of what each slot's cache holds
        self.prompt_cache = PromptCache(prompt_cache_bytes) if prompt_cache_bytes and target.saves_sequences else None
        self._waiting: collections.deque[QueuedRequest] = collections.deque()
        self._running: dict[int, QueuedRequest] = {}  # slot -> the job being generated on it
        self._erasing: list[tuple[int, str | None, concurrent.futures.Future]] = []  # erase(): slots to empty, in order
        self._changed = threading.Condition()  # guards _waiting, _running, _erasing and _stopping
        self._stopping = False
        self.lost: TargetLost | None = None  # set once, by lose()
        self._thread = threading.Thread(target=self._run, name="specsample-worker", daemon=True)
        # Seconds the thread spent on generations (model calls and every sequence's own
        # work between them), not waiting for requests: /metrics, for bench --serve.
        self.busy_seconds = 0.0
        self._woke: float | None = None  # when the thread last stopped waiting for work

    @property
    def active(self) -> int:
        """Requests being generated now (slots in use)."""
        return self.parallel - len(self.admission.free)

    @property
    def depth(self) -> int:
        """Requests waiting, not counting the one being generated nor those cancelled."""
        with self._changed:
            return sum(not job.cancelled.is_set() for job in self._waiting)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 3.0) -> None:
        """shut_down(), and wait for the thread to end."""
        self.shut_down()
        if self.lost is None:  # else the thread is parked inside the lost call for good
            self._thread.join(timeout)

    def shut_down(self) -> None:
        """End every request, waiting or being generated, with ShuttingDown (a 503, or a
        stream's error event) and refuse later ones; the thread ends once each
        generation has stopped at its next call. Does not wait: safe on the event loop."""
        with self._changed:
            self._stopping = True
            for job in self._waiting:
                job.cancel()
                job.emit(self._cut())
            self._waiting.clear()
            for job in self._running.values():
                job.cancel()
            for *_, done in self._erasing:  # the thread ends before it comes to them
                _settle(done, error=ShuttingDown("the server is shutting down; the slot was not erased"))
            self._erasing.clear()
            self._changed.notify()

    def _cut(self) -> Ended:
        """How a cancelled request ends: its client left, or the server is shutting down."""
        return Ended(End.FAILED, ShuttingDown("the server is shutting down")) if self._stopping else Ended(End.CANCELLED)

    def lose(self, error: TargetLost) -> None:
        """The target is gone for good: every request being generated or waiting ends
        with `error`, and so does every later one. Called on the worker thread from
        inside its last model call, which never returns (rpc.guard_aborts)."""
        with self._changed:
            self.lost = error
            for job in {id(j): j for j in [*self._running.values(), *self._waiting]}.values():  # a job on several slots once
                job.emit(Ended(End.FAILED, error))
            for *_, done in self._erasing:  # the thread that would do them never comes back
                _settle(done, error=error)
            self._running.clear()
            self._waiting.clear()
            self._erasing.clear()

    def submit(self, job: QueuedRequest) -> None:
        with self._changed:
            if self.lost is not None:
                raise self.lost
            if self._stopping:
                raise ShuttingDown("the server is shutting down")
            # A request that timed out or whose client left while waiting holds no
            # place: without this, --max-queue of them would turn everyone away.
            self._drop_cancelled()
            if len(self._waiting) >= self.max_queue:
                raise QueueFull
            self._waiting.append(job)
            self._changed.notify()

    def erase(self, seq: int, cache_salt: str | None = None) -> concurrent.futures.Future:
        """Empty slot `seq`'s caches (target and draft model), as llama-server's
        `/slots/N?action=erase`: a later request finds nothing of an earlier one there
        (cache_prompt). Done on the worker thread before it admits any request submitted
        after this call; the future gives the tokens the slot held, or SlotBusy while a
        request is being generated on it. Only a cache filled under `cache_salt` is
        erased: another salt's is none of the caller's to see, so it stays, and the
        future gives 0, as for an empty slot."""
        if not 0 <= seq < self.parallel:
            raise ValueError(f"slot {seq}: this server has slots 0 to {self.parallel - 1}")
        done: concurrent.futures.Future = concurrent.futures.Future()
        with self._changed:
            if self.lost is not None:
                raise self.lost
            if self._stopping:
                raise ShuttingDown("the server is shutting down; the slot was not erased")
            self._erasing.append((seq, cache_salt, done))
            self._changed.notify()
        return done

    def _erase(self) -> None:
        with self._changed:
            erasing, self._erasing = self._erasing, []
        for seq, salt, done in erasing:
            if seq not in self.admission.free:
                _settle(done, error=SlotBusy(f"slot {seq} is generating a request"))
                continue
            if self._salts[seq] != salt:
                _settle(done, 0)
                continue
            held = self.slots[seq].length
            self._empty(seq)
            if self.prompt_cache is not None:  # nor do the texts kept in host memory under the salt
                self.prompt_cache.drop(salt)
            _settle(done, held)

    def _empty(self, seq: int) -> None:
        for slot in (self.slots[seq], self.draft_slots[seq]):
            if slot is not None:
                slot.rollback(0)

    def _drop_cancelled(self) -> None:
        for job in [j for j in self._waiting if j.cancelled.is_set()]:
            self._waiting.remove(job)
            job.emit(Ended(End.CANCELLED))

    def _run(self) -> None:
        self.admission.run(self._admit)

    def _admit(self, admission: Admission) -> bool:
        """The server's policy between rounds: waits while there is nothing to do, then
        empties the slots asked to be erased and starts the waiting requests that the free
        slots hold; False once stopped and every generation has ended."""
        if self._woke is not None:  # the round just made was work
            self.busy_seconds += time.perf_counter() - self._woke
        admitted = self._next_jobs(len(admission.free))
        self._woke = time.perf_counter()
        if admitted is None:
            return False
        self._erase()  # before the newcomers: they were submitted after the erase was asked
        for job in admitted:
            # A request's choices go to as many free slots as they fill, as llama-server
            # and vLLM spread n: each slot takes the job's next choice until none is left.
            job.parts = min(len(job.choices), len(admission.free))  # all counted before any can end
            for _ in range(job.parts):
                admission.start(self._slot_for(job), functools.partial(self._serve, job), job.cancelled.is_set)
        return True

    def _next_jobs(self, free: int) -> list[QueuedRequest] | None:
        """The jobs to start now, as many as `free` slots hold (a job of n choices takes
        up to n), waiting for one while nothing is being generated; None once stopped and
        every generation has ended."""
        with self._changed:
            while not self._waiting and not self.scheduler.live and not self._erasing and not self._stopping:
                self._changed.wait()
            if self._stopping:  # the cancelled generations still run to their next call
                return [] if self.scheduler.live else None
            admitted = []
            while self._waiting and free:
                job = self._waiting.popleft()
                if job.cancelled.is_set():  # timed out or disconnected while waiting
                    job.emit(Ended(End.CANCELLED))
                else:
                    admitted.append(job)
                    free -= min(len(job.choices), free)
            return admitted

    def _slot_for(self, job: QueuedRequest) -> int:
        """A free slot for the job: with cache_prompt, the one whose cache holds the longest
        start of its first prompt (a chat's earlier turns, an editor's file); else the
        first."""
        first, free = job.choices[0], self.admission.free
        if not first.cache_prompt:
            return free[0]
        # Only a slot filled under the job's own salt may be reused (-1: any other is emptied first).
        return max(free, key=lambda seq: -1 if self._salts[seq] != job.cache_salt else
                   common_prefix_length(self.slots[seq].cached_tokens() or [], first.prompt_ids))

    def _serve(self, job: QueuedRequest, seq: int) -> None:
        with self._changed:
            self._running[seq] = job
            if self._stopping:  # admitted as stop() began
                job.cancel()
        if self._salts[seq] != job.cache_salt:
            # Another salt's text: nothing of it may be reused, or cached_tokens (and the
            # time to the first token) would tell this request how much of it it guessed.
            # Its own salt's requests may still find it in host memory.
            if self.prompt_cache is not None:
                keep(self.prompt_cache, self._salts[seq], self.slots[seq], self.draft_slots[seq])
            self._empty(seq)
            self._salts[seq] = job.cache_salt
        try:
            self._generate(job, seq)
        finally:
            with self._changed:
                self._running.pop(seq, None)  # lose() may have cleared it

    def _generate(self, job: QueuedRequest, seq: int) -> None:
        # Every job ends with exactly one Ended, sent by the last of its slots to stop
        # (_end). A task's checks (stream()'s) come before any model call for it, so a
        # refusal is told apart by where it was raised, and the first task's comes
        # before Started, while a stream can still answer with a 400.
        try:
            drafter = None
            while (task := job.take()) is not None:
                # Asked between tasks, between scoring calls and before a generation
                # starts as well as between rounds: a client that left holds the
                # model for one call at most, whatever it asked for.
                _stop_if_cancelled(job)
                self._reuse(seq, task)
                s = None
                if task.config is not None:
                    drafter = drafter or job.make_drafter(self.draft_slots[seq])
                    try:  # checks the request
                        s = stream(self.slots[seq], task.prompt_ids, task.config, drafter, self.policies[seq])
                    except ValueError as e:
                        self._end(job, Ended(End.REFUSED, e))
                        return
                job.start()
                if task.prompt_logprobs is not None:
                    scored = score_prompt(self.slots[seq], task.prompt_ids, task.prompt_logprobs,
                                          cancelled=job.cancelled.is_set)
                    _stop_if_cancelled(job)  # scored is None then
                    job.emit(PromptScored(task.index, scored))
                _stop_if_cancelled(job)  # before the prefill
                if s is None:
                    if task.warm:
                        warm(self.slots[seq], task.prompt_ids)
                    job.emit(Finished(task.index, GenerationResult([], "", GenerationStats(), "length")))
                    continue
                for chunk in s:
                    job.emit(Generated(task.index, chunk))
                    # Before computing the next round; the slot's next job starts
                    # with a rollback: nothing to clean up.
                    _stop_if_cancelled(job)
                job.emit(Finished(task.index, s.result))
        except (_Cancelled, Cancelled):  # Cancelled: between a prompt's chunks
            self._end(job, self._cut())
            return
        except Exception as e:  # reported to the request (a 500 naming its type); the worker keeps serving
            log.exception("slot %d: generation failed", seq)  # the operator's log keeps what the 500 does not say
            self._end(job, Ended(End.FAILED, e))
            return
        self._end(job, Ended(End.DONE))

    def _reuse(self, seq: int, task: ChoiceTask) -> None:
        """Before a task's prompt goes into slot `seq`: prompt_cache.before_prompt, where
        the task writes into the slot (echo alone leaves it as it is)."""
        if self.prompt_cache is not None and (task.config is not None or task.warm or task.prompt_logprobs is not None):
            before_prompt(self.prompt_cache, self._salts[seq], self.slots[seq], self.draft_slots[seq],
                          task.prompt_ids, task.cache_prompt)

    @staticmethod
    def _end(job: QueuedRequest, ended: Ended) -> None:
        """One slot of the job stopped: the first early end cancels the others, and the
        last to stop sends the job's one Ended (the early end's, if any)."""
        job.parts -= 1
        if ended.end is not End.DONE and job.outcome is None:
            job.outcome = ended
            job.cancel()
        if job.parts == 0:
            job.emit(job.outcome or ended)


def _settle(done: concurrent.futures.Future, result=None, error: BaseException | None = None) -> None:
    """An erase's outcome, unless its asker has gone: a client that leaves while waiting
    cancels the future, and setting a cancelled one raises (in the worker's thread)."""
    try:
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)
    except concurrent.futures.InvalidStateError:
        pass


def warm(slot: Backend, prompt_ids: list[int]) -> None:
    """The prompt into the slot's cache, less what it holds already, without a row of
    logits: what a later request that starts with it finds (cache_prompt)."""
    held = common_prefix_length(slot.cached_tokens() or [], prompt_ids)
    slot.rollback(held)
    slot.score(prompt_ids[held:], num_logits=0)
