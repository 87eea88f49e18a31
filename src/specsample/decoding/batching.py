"""Many sequences per model call: continuous batching with speculation per sequence.

Each sequence runs the unchanged generation loop (generate.stream) in a greenlet of
its own, on a `Slot`: one sequence of a backend that holds several (llama.cpp
sequence ids). A slot's score() does not call the model; it hands the request to the
`Scheduler` and sleeps. When every live sequence is asleep on a request, the
scheduler makes the calls, one per backend, with every waiting sequence's tokens in
it, and wakes each with its own rows:

    sequence A: draft draft ....... score(pending + 3 drafts) ... verify, emit
    sequence B: ................... score(pending)            ... verify, emit
    sequence C: draft ............. score(pending + 1 draft)  ... verify, emit
                 \\ draft calls: A+C,  then A \\  one target call: 1 + 4 + 2 tokens

Draft-model requests go first: a sequence that drafts reaches its target request a
few draft steps later, and the target call waits for every live sequence, so that
one call serves them all (the slack of a memory-bound call is what batching and
speculation both spend). Before that, a sequence about to play a round asks for its
plan (its seat, wrapped in `Scheduled`, sleeps on the request), and the scheduler
hands every such request to the planner at once (control.py), with the prompt chunks
in the coming call as fixed load; it then records every call it makes to that
planner, once. This is the only place that knows a sequence runs in a batch: the
planner and the loop never look at greenlets. Sequences join and leave between calls:
a newcomer's prompt is scored in chunks (`prefill_chunk` tokens per call), so it does
not stall the others for long.

Why greenlets rather than a loop that steps every sequence: the loop's round (draft,
score, verify, emit, with grammars, stop strings, log-probabilities and the
policy) stays one readable function of one sequence, and every sequence keeps its
own sampler, seed, verifier, grammar and statistics; the scheduler only sees model
calls. Greenlets switch only at those calls, so a batch runs on one thread, in an
order fixed by the sequences' arrival: a seeded run is reproducible, and nothing
needs a lock.

Exactness: a sequence's rows depend only on its own tokens, so its output follows
its own target distribution whatever shares the call. With batch-invariant kernels
(--batch-invariant) a row is even bitwise the row it would be alone; with llama.cpp's
default kernels it moves with the call's size, as it already does with the number
of drafts (docs/results/numerics).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import greenlet
import torch

from ..backends.base import Backend, SavedSequence, take_model_attributes
from .plans import ModelCall, Offer, Plan, Policy, RoundReport, Seated, reads_text

PREFILL_CHUNK = 128  # prompt tokens a newcomer adds to one call while others decode


class Slot(Backend):
    """One sequence of a backend that holds several, as a Backend of its own: what the
    loop, the drafters and prompt scoring use. Outside a scheduler it calls the model
    itself (a batch of one)."""

    def __init__(self, shared, seq: int):
        self.shared, self.seq = shared, seq
        self.name = shared.name if shared.sequences == 1 else f"{shared.name}[{seq}]"
        take_model_attributes(self, shared)

    @property
    def length(self) -> int:
        return self.shared.sequence_length(self.seq)

    def score(self, token_ids: list[int], num_logits: int) -> torch.Tensor:
        current = greenlet.getcurrent()
        if not isinstance(current, _Sequence):
            return self.shared.score_many([(self.seq, token_ids, num_logits)])[0]
        if not token_ids:
            return torch.empty(0, self.vocab_size)
        # A long prompt goes in chunks, one per call, so the others keep decoding; each
        # chunk asks for the rows of the wanted positions it holds.
        rows = []
        chunk = current.scheduler.prefill_chunk
        first_wanted = len(token_ids) - num_logits
        for start in range(0, len(token_ids), chunk):
            if current.cancelled is not None and current.cancelled():  # its owner left: no more of its prompt
                raise Cancelled(f"{self.name}: cancelled after {start} of {len(token_ids)} tokens")
            piece = token_ids[start : start + chunk]
            wanted = max(0, start + len(piece) - max(first_wanted, start))
            rows.append(current.parent.switch(_Request(self, piece, wanted)))
        return torch.cat(rows) if len(rows) > 1 else rows[0]

    def rollback(self, length: int) -> None:
        self.shared.rollback_sequence(self.seq, length)

    def cached_tokens(self) -> list[int] | None:
        return self.shared.sequence_tokens(self.seq)

    # A slot is one sequence: the `seq` of the protocol (0) is the slot's own.
    def save_sequence(self, seq: int = 0) -> SavedSequence:
        return self.shared.save_sequence(self.seq)

    def restore_sequence(self, seq: int, saved: SavedSequence, length: int) -> None:
        self.shared.restore_sequence(self.seq, saved, length)


def slots(shared) -> list[Slot]:
    """A Slot for each sequence the backend holds."""
    return [Slot(shared, seq) for seq in range(shared.sequences)]


@dataclass
class _Request:
    slot: Slot
    token_ids: list[int]
    num_logits: int


@dataclass
class _PlanRequest:
    seat: Seated
    offer: Offer


class Scheduled(Policy):
    """A seat of a planner (plans.Seated) played in a scheduler's sequence. The
    scheduler is the one boundary between a batch and its planner: the seat's round is
    planned with every other sequence's (Scheduler._plan) and each shared call is
    recorded once, by the scheduler (Scheduler._call), so the seat's reports only teach
    it. Alone, the seat is a batch of one and does both itself."""

    def __init__(self, seat: Seated):
        self.seat, self.k_max = seat, seat.k_max

    def begin(self, context: list[int], max_new_tokens: int) -> None:
        self.seat.start(max_new_tokens)

    def plan(self, offer: Offer) -> Plan:
        plan = self.seat.offered(offer)
        return plan if plan is not None else greenlet.getcurrent().parent.switch(_PlanRequest(self.seat, offer))

    def observe(self, report: RoundReport) -> None:
        self.seat.learn(report)

    def ahead(self, drafted: int, call_tokens: int) -> int:
        return self.seat.ahead(drafted, call_tokens)

    def end(self) -> None:
        self.seat.end()

    def fork(self) -> Scheduled:
        return Scheduled(self.seat.fork())


def scheduled(policy: Policy | None) -> Policy | None:
    """The policy a sequence of a scheduler plays: a seat of a planner goes through the
    scheduler (Scheduled); any other policy (FixedK) plans alone."""
    return Scheduled(policy) if isinstance(policy, Seated) else policy


class Cancelled(Exception):
    """Raised in a sequence whose `cancelled()` became true, before its next prompt chunk:
    a long prompt's owner that left holds the model for one call at most."""


class _Sequence(greenlet.greenlet):
    """A greenlet that runs one sequence's work; `scheduler` is the one it belongs to."""

    def __init__(self, run: Callable[[], object], scheduler: "Scheduler", cancelled: Callable[[], bool] | None = None):
        super().__init__(run)
        self.scheduler, self.cancelled = scheduler, cancelled


@dataclass
class Job:
    """One unit of work the scheduler runs in a sequence: its outcome once done."""

    run: Callable[[], object]
    result: object = None
    error: BaseException | None = None
    done: bool = False


@dataclass
class BatchStats:
    """What the scheduler's calls looked like: per target call, its sequences and tokens."""

    target_calls: int = 0
    sequences_per_call: list[int] = field(default_factory=list)  # histogram: [n] = calls serving n sequences
    tokens_per_call: list[int] = field(default_factory=list)  # histogram: [n] = calls scoring n tokens
    target_seconds: float = 0.0
    draft_calls: int = 0
    draft_seconds: float = 0.0

    def record(self, target: bool, sequences: int, tokens: int, seconds: float) -> None:
        if target:
            self.target_calls += 1
            self.target_seconds += seconds
            _bump(self.sequences_per_call, sequences)
            _bump(self.tokens_per_call, tokens)
        else:
            self.draft_calls += 1
            self.draft_seconds += seconds


class Scheduler:
    """Runs jobs, each in a sequence of its own, and makes their model calls together.

    `target` is the backend (the shared one the slots belong to) whose calls wait for
    every live sequence; calls on any other backend (the draft model's) are made as
    soon as no sequence can run on without them. Single-threaded: add jobs and call
    step() from one thread.
    """

    def __init__(self, target, prefill_chunk: int = PREFILL_CHUNK, clock=time.perf_counter, on_call=None):
        if prefill_chunk < 1:
            raise ValueError(f"prefill chunk must be >= 1 token, got {prefill_chunk}")
        self.target, self.prefill_chunk, self.clock = target, prefill_chunk, clock
        # on_call(target, sequences, tokens, seconds, prompt) after every call; `prompt`:
        # it fed some sequence text to take in rather than to score (prompt_work).
        self.on_call = on_call
        self.stats = BatchStats()
        self._waiting: dict[_Sequence, _Request | _PlanRequest] = {}  # live sequences, each asleep on its request
        self._jobs: dict[_Sequence, Job] = {}
        self.planners: dict[int, object] = {}  # the planners of the seats it has planned for: they hear every call

    @property
    def live(self) -> int:
        return len(self._jobs)

    def add(self, run: Callable[[], object], cancelled: Callable[[], bool] | None = None) -> Job:
        """Start `run()` in a sequence of its own: it runs until its first model call
        (or to its end) now, and from then on inside step(). Once `cancelled()` is true,
        its next prompt chunk raises Cancelled in it instead of being scored."""
        job = Job(run)
        sequence = _Sequence(lambda *_: _capture(job), self, cancelled)
        self._jobs[sequence] = job
        self._resume(sequence, None)
        return job

    def step(self) -> bool:
        """Make the next calls: every draft-model request if there is one, otherwise
        the target call that serves every live sequence. False: nothing was waiting."""
        if not self._waiting:
            return False
        planning = {s: r for s, r in self._waiting.items() if isinstance(r, _PlanRequest)}
        if planning:
            self._plan(planning)
            return True
        others = {s: r for s, r in self._waiting.items() if r.slot.shared is not self.target}
        if others:
            by_backend: dict[int, dict[_Sequence, _Request]] = {}
            for sequence, request in others.items():
                by_backend.setdefault(id(request.slot.shared), {})[sequence] = request
            for group in by_backend.values():
                self._call(group, target=False)
        else:
            self._call(dict(self._waiting), target=True)
        return True

    def run(self, jobs: Iterable[Callable[[], object]] = ()) -> None:
        """Add the jobs and step until every sequence is done."""
        for run in jobs:
            self.add(run)
        while self.step():
            pass

    def _plan(self, planning: dict[_Sequence, _PlanRequest]) -> None:
        """Every round about to be played planned together, by each seat's planner (one
        for all, as a server makes them), with the prompts read in the same call."""
        load = sum(len(r.token_ids) for r in self._waiting.values()
                   if isinstance(r, _Request) and r.slot.shared is self.target)
        by_planner: dict[int, dict[_Sequence, _PlanRequest]] = {}
        for sequence, request in planning.items():
            by_planner.setdefault(id(request.seat.planner), {})[sequence] = request
            del self._waiting[sequence]
        for group in by_planner.values():
            planner = next(iter(group.values())).seat.planner
            self.planners[id(planner)] = planner
            plans = planner.decide({r.seat: r.offer for r in group.values()}, load)
            for sequence, request in group.items():
                self._resume(sequence, plans[request.seat])

    def _call(self, group: dict[_Sequence, _Request], target: bool) -> None:
        requests = list(group.values())
        shared = requests[0].slot.shared
        tokens = sum(len(r.token_ids) for r in requests)
        for sequence in group:
            del self._waiting[sequence]
        started = self.clock()
        try:
            rows = shared.score_many([(r.slot.seq, r.token_ids, r.num_logits) for r in requests])
        except Exception as error:  # every sequence in the call hears it, in its own loop
            for sequence in group:
                self._resume(sequence, None, error)
            return
        ended = self.clock()
        seconds = ended - started
        self.stats.record(target, len(requests), tokens, seconds)
        prompt = prompt_work(requests, target)
        if self.on_call is not None:
            self.on_call(target, len(requests), tokens, seconds, prompt)
        for planner in self.planners.values():
            planner.record(ModelCall(target, tokens, len(requests), seconds, prompt), ended)
        for sequence, logits in zip(group, rows):
            self._resume(sequence, logits)

    def _resume(self, sequence: _Sequence, value, error: BaseException | None = None) -> None:
        """Run a sequence until its next request (kept) or its end (dropped)."""
        request = sequence.throw(error) if error is not None else sequence.switch(value)
        if sequence.dead:
            del self._jobs[sequence]
        else:
            self._waiting[sequence] = request


def prompt_work(requests: list[_Request], target: bool) -> bool:
    """Whether a call feeds some sequence text that it takes in without scoring (plans.reads_text)."""
    return any(reads_text(len(r.token_ids), r.num_logits, target) for r in requests)


def _capture(job: Job) -> None:
    try:
        job.result = job.run()
    except BaseException as error:  # the caller reads it from the job; the others go on
        job.error = error
    job.done = True


def _bump(histogram: list[int], index: int) -> None:
    histogram.extend([0] * (index + 1 - len(histogram)))
    histogram[index] += 1
