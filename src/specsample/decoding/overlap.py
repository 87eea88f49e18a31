"""Drafting during the target's call, where the target computes elsewhere (llama.cpp
RPC workers): parallel speculative decoding (PEARL, ICLR 2025).

While the workers score a round's block, this process's cores would sit idle; the
draft model spends them drafting the next block, on from the block's last draft as if
every draft were accepted (and, during the prompt's prefill, reading the prompt). If
the target accepts the whole block, that next block is verified in the next round
instead of a bonus token being drawn, and its drafting cost nothing beside the call;
if it rejects any draft, the next block was drafted after text that is not the
output, and is dropped. Worked example, blocks of 3:

    round t:   drafts [a b c]; target scores [pending a b c] on the workers, while
               the draft drafts [d e f] after ...a b c
    verdict:   all three accepted -> emit [a b c], no bonus; keep [d e f] and the
               target's row after c (it predicts the token after c)
    round t+1: target scores [d e f] (its cache holds ...a b c already); the kept row
               and the three new ones verify d, e, f and give the bonus or recovered
               token; meanwhile the draft drafts [g h i] after ...d e f
    or:        b rejected -> emit [a x] (x recovered), drop [d e f]; round t+1 drafts
               afresh after ...a x, as without the overlap

Why the output stays the target's: the next block's tokens are drawn from the draft's
distributions after the block, before anything of round t is verified, and with
nothing of round t's verification (its uniforms, its rows) in them. Whether they are
used is decided by the verdict of round t, which is the past of the position they
fill: given that the whole block was accepted, the text before that position is the
block, after which they were drawn, and each is verified by the same modified
rejection sampling (or coupled verifier) against the target's row for that text, so
it emits a token distributed as that row, exactly as a bonus token drawn from it would
be. How many tokens the next block has is fixed before it is drafted (Policy.ahead:
from this round's drafts and the prices of past calls, within the budget), and the
next round's plan, which may cut the block short (or to nothing: then the bonus is
drawn from the kept row), is made from what the policy knows before that round, as
every plan is: never from the block's tokens.
The negative controls in tests/test_overlap.py fail the distribution check: a kept
block verified against the row of its round's last draft instead of the row after it,
and a block kept only when its first draft looks acceptable. (Keeping a block after a
rejection, verified after the recovered token, would waste it but stay exact:
modified rejection sampling is exact for any proposal drawn before the verification.)

The target's calls run on a thread of the stream's own (llama.cpp's calls release the GIL); nothing else
touches the target meanwhile, and the draft and the sampler are touched by this
thread alone, so a seeded run is reproducible. A worker lost mid-call parks the call's
thread (rpc.guard_aborts), and this one waits on it for good, as the loop did inside
the call. A batch (batching.py) never overlaps: its sequences share the calls, and
its streams are not told to.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time

import torch

from ..backends.base import Backend
from .drafters import Draft, Drafter
from .plans import MODEL, Offer, Plan, Policy
from .rounds import Called, TargetCalls
from .sampling import Sampler
from .verify import Verdict


def stream_overlaps(overlap: bool, drafter: Drafter | None, grammar) -> bool:
    """Whether a stream drafts during its target's calls: the pair is placed so
    (`overlap`: target and draft compute apart, which assembly decides once:
    assemble.pair_overlaps), a draft model drafts, and no grammar masks the drafts (the
    next block would need the grammar moved past a block not yet accepted)."""
    return overlap and drafter is not None and drafter.model_backend is not None and grammar is None


class TargetCall:
    """target.score(fed, num_logits) on the stream's call thread (CallThread), timed
    there; by default a row for every token fed."""

    def __init__(self, thread: CallThread, target: Backend, fed: list[int], clock=time.perf_counter,
                 num_logits: int | None = None):
        self.rows: torch.Tensor | None = None
        self.error: BaseException | None = None
        self.seconds = 0.0
        self._args = (target, fed, clock, num_logits or len(fed))
        self._done = threading.Event()
        thread.run(self)

    def __call__(self) -> None:  # on the call thread
        target, fed, clock, num_logits = self._args
        t0 = clock()
        try:
            self.rows = target.score(fed, num_logits=num_logits)  # [num_logits, vocab]
        except BaseException as e:  # raised again on the loop's thread (result)
            self.error = e
        self.seconds = clock() - t0
        self._done.set()

    def wait(self) -> None:
        self._done.wait()

    def result(self) -> torch.Tensor:
        self.wait()
        if self.error is not None:
            raise self.error
        return self.rows


class CallThread:
    """One daemon thread per stream that runs its target calls, one at a time, in
    order: starting a thread per call cost more than a toy model's call. It starts with
    the first call and ends when the stream closes it; a thread parked in a call on a
    lost worker never blocks the process's exit (daemon)."""

    def __init__(self):
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def run(self, call: TargetCall) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, daemon=True, name="target-call")
            self._thread.start()
        self._calls.put(call)

    def _serve(self) -> None:
        while (call := self._calls.get()) is not None:
            call()

    def close(self) -> None:
        if self._thread is not None:
            self._calls.put(None)
            self._thread = None


def meanwhile(call: TargetCall | None, work):
    """work() while `call` runs; if work fails, the call is waited for before the error
    goes up, so that the target is never left in the middle of a call."""
    try:
        return work()
    except BaseException:
        if call is not None:
            call.wait()
        raise


class Overlap(TargetCalls):
    """How one stream's rounds call the target when drafting runs during the call
    (rounds.play_round's `calls`); holds the block drafted during the last call while
    it waits for its round."""

    def __init__(self):
        self.block: Draft | None = None  # kept from the last round: its drafts are this round's
        self.ahead: Draft | None = None  # drafted during this round's call, until its verdict
        self.calls = CallThread()

    def close(self) -> None:
        self.calls.close()

    def prefill(self, target: Backend, drafter: Drafter, prompt_ids: list[int], reused: int,
                sampler: Sampler) -> torch.Tensor:
        """The target's prompt prefill (from token `reused` on), whose last row
        ([1, vocab]) it returns, while the draft reads the prompt (all of it but the
        last token, which the first drafting round feeds): on a long prompt the draft
        is ready to draft from the first round instead of catching up in plain ones."""
        call = TargetCall(self.calls, target, prompt_ids[reused:], num_logits=1)
        try:
            meanwhile(call, lambda: drafter.draft(prompt_ids, Plan(None, 0, catch_up=len(prompt_ids)), sampler))
            return call.result()
        except BaseException:  # no rounds follow, so no loop will close the thread
            self.close()
            raise

    def drafts(self, drafter: Drafter, policy: Policy, sampler: Sampler, grammar: None, context: list[int],
               room: int, free: bool) -> tuple[Draft, int, bool]:
        """The block kept from the last round, as far as the policy's plan keeps it: it
        still plans the round (its books, its probes), and may cut the block short;
        without one, the round's own drafts (never with a grammar: stream_overlaps)."""
        block, self.block = self.block, None
        if block is None:
            return super().drafts(drafter, policy, sampler, grammar, context, room, free)
        plan = policy.plan(Offer({MODEL: len(block)}))
        return cut(block, plan.length if plan.source == MODEL else 0), 0, True

    def score(self, target: Backend, fed: list[int], clock, drafter: Drafter, policy: Policy, sampler: Sampler,
              context: list[int], draft: Draft, room: int) -> Called:
        """The call on the stream's call thread, and meanwhile the next block, after
        this one, as if all of it were accepted (settle keeps it or drops it)."""
        t1 = clock()
        call = TargetCall(self.calls, target, fed, clock) if fed else None
        size = next_block_size(draft, policy.ahead(len(draft), len(fed)), policy.k_max, room)
        calls_before = drafter.calls
        ahead = context + draft.tokens.tolist()
        self.ahead = meanwhile(call, lambda: drafter.draft(ahead, Plan(MODEL, size, size), sampler)) if size else None
        t2 = clock()
        rows = call.result() if call else None  # [len(fed), vocab]
        t3 = clock()
        seconds = call.seconds if call else 0.0
        return Called(rows, seconds, max(0.0, seconds - (t3 - t2)), t2 - t1, drafter.calls - calls_before)

    def settle(self, draft: Draft, verdict: Verdict, logits: torch.Tensor) -> tuple[Verdict, torch.Tensor | None]:
        block, self.ahead = self.ahead, None
        return self.keep(block, draft, verdict, logits)

    def keep(self, block: Draft | None, draft: Draft, verdict: Verdict,
             logits: torch.Tensor) -> tuple[Verdict, torch.Tensor | None]:
        """After the verdict on `draft`: where all of it was accepted, keep the next
        block, and emit the drafts without the bonus (its position is the block's first
        draft's, verified next round against the last row, [1, vocab], returned to
        carry); else the verdict as it is."""
        if block is None or not len(block) or verdict.num_accepted < len(draft):
            return verdict, None
        self.block = dataclasses.replace(block, calls=[dataclasses.replace(c, hidden=True) for c in block.calls])
        return Verdict(verdict.tokens[:-1], verdict.num_accepted), logits[-1:]


def cut(draft: Draft, n: int) -> Draft:
    """The first n drafts of `draft` (its calls all: they were made)."""
    probs = None if draft.probs is None else draft.probs[:n]
    return Draft(draft.tokens[:n], probs, draft.sources[:n], draft.confidences[:n], draft.calls)


def next_block_size(draft: Draft, wanted: int, k_max: int, room: int) -> int:
    """Drafts in the next block: `wanted` (Policy.ahead), when the draft model made
    all of this round's (lookups and forced tokens cost no drafting to hide), within
    K and what the budget leaves after this block (its tokens, then the next block and
    its bonus)."""
    m = len(draft)
    if not m or any(source != MODEL for source in draft.sources):
        return 0
    return max(0, min(wanted, k_max, room - m - 1))
