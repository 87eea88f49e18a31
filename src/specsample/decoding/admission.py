"""One admission loop for continuous batching: the library's `generate_many` and the
server's worker (serve/worker.py) both run their sequences through it.

A backend holds a fixed number of sequences, its slots. Work joins on a free slot
between rounds of model calls, and the slot is free again once that work's function
ends, however it ends: a result, an error, a cancellation (batching.Cancelled). This
module keeps that bookkeeping and the loop

    admit (start work on free slots) -> one round of calls (Scheduler.step) -> admit ...

The caller supplies only its policy, `admit`: what to start on which free slots now,
and whether to go on:

    generate_many   the prompts in order, each on the slot free longest, until every
                    prompt has run
    serve.Worker    its queue: waits while idle, drops requests cancelled while waiting,
                    spreads a request's n choices over the free slots, prefers the slot
                    whose cache holds the prompt, erases slots, stops
"""

from __future__ import annotations

from collections.abc import Callable

from .batching import Job, Scheduler


class Admission:
    """The free slots of `scheduler`'s target (`slots` of them) and the loop that admits
    work into them. Single-threaded, as the scheduler is."""

    def __init__(self, scheduler: Scheduler, slots: int):
        self.scheduler = scheduler
        # In the order they were freed: free[0] has been free longest.
        self.free: list[int] = list(range(slots))

    def start(self, seq: int, run: Callable[[int], object], cancelled: Callable[[], bool] | None = None) -> Job:
        """Run `run(seq)` on the free slot `seq`, in a sequence of the scheduler (see
        Scheduler.add for `cancelled`); the slot is free again once it returns or raises."""
        if seq not in self.free:
            raise ValueError(f"slot {seq} is not free (free: {self.free})")
        self.free.remove(seq)

        def on_slot() -> object:
            try:
                return run(seq)
            finally:
                self.free.append(seq)

        return self.scheduler.add(on_slot, cancelled)

    def run(self, admit: Callable[[Admission], bool]) -> None:
        """Admit, then make one round of calls, until `admit` returns False. `admit`
        starts what it chooses on free slots (start); it may block while there is
        nothing to do, and a round with nothing live makes no call."""
        while admit(self):
            self.scheduler.step()
