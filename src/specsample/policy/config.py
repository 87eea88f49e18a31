"""Every number the planner (-k auto) decides with, in one place, each with why it is
what it is and, where one exists, the measurement that set it (a commit whose message
or docs/benchmarks.md section gives the run). docs/planner.md has them as a table, with
the ones a sensitivity study should vary first.

Three kinds: *tuning* numbers a study may vary (half and double); *structural* ones
that follow from what the code does (varying them would break a promise, not tune a
trade-off); and *derived* ones, computed from the others below (properties), never
set on their own. PLANNER is the configuration every run uses; a study passes another
(make.make_policy(config=...), Planner(config=...)) to the planner and its estimates.
The calibration's numbers (reps .. most_slots) are read from PLANNER: what they change
is the measurement, which is cached on disk per machine and model pair, not per run.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PlannerConfig:
    # -- What a round may be (control.py) -------------------------------------------------
    # Tuning. The most drafts a round proposes (--k-max; Planner, make_policy, assembly,
    # the bench). Rounds of up to 9 tokens; the best fixed K on this repository's pairs
    # was 2-6 (docs/benchmarks.md "-k auto against the best fixed K"), so 8 leaves room
    # above it for text that copies. Since 1f407e8; no run compared other caps.
    k_max: int = 8
    # Tuning. With several sequences, coordinate ascent also starts from "every sequence
    # drafts L" for these L: a joint move no sequence makes alone, since alone it would
    # pay the draft's steps by itself (b3e2531). No run compared other sets.
    joint_lengths: tuple[int, ...] = (1, 2, 4)
    # Tuning. Passes of coordinate ascent over the sequences' options (b3e2531); a pass
    # that changes nothing stops it sooner.
    ascent_passes: int = 3

    # -- A draft model behind unread text (control.py) ----------------------------------
    # Tuning. A draft reads its unread text inside a drafting round while that costs at
    # most this many plain steps; past it the text is read in chunks beside plain steps.
    # 46942c1: short HumanEval answers lost 10% waiting for chunks when any reading
    # went to chunks; docs/benchmarks.md (rpc-overlap): a 100-token prompt on one core
    # cost more than four plain steps to read and -k auto stepped plain until caught up.
    stall: float = 4.0
    # Tuning. The largest catch-up chunk; chunks run in powers of two from read_chunk
    # up to it (catch_up_chunks), the largest that costs about a plain round is read
    # (b3e2531).
    catch_up_largest: int = 512
    # Tuning. No catch-up reading before this many tokens are out: the first tokens
    # are what a user waits for (b3e2531, issue 51's first-token work).
    catch_up_after: int = 2
    # Structural. A draft call feeds the last emitted token and, after a full accept,
    # the last draft (which it never consumed): an offer's lag beyond this is unread
    # text, priced as reading (the same rule as plans.reads_text, which marks a call
    # that read: ModelCall.prompt).
    fed_per_round: int = 2

    # -- Acceptance (estimates.Acceptance, SourceModel, Rate) ----------------------------
    # Tuning. Decay per observed round of a source's acceptance counts: an effective
    # memory of about ten rounds (1f407e8, 62e2a18). No run compared others.
    acceptance_decay: float = 0.9
    # Tuning. Decay per round a source sits out (Acceptance) and per round of another
    # kind (Goodput): evidence against a source fades over a few hundred rounds, so it
    # is probed again. 1b21100: lookups that played one round in twenty never gathered
    # the goodput guard's evidence while every kind decayed at goodput_decay (chat
    # Q4_K_M, -k auto 0.93x plain before, 0.97x after: docs/benchmarks.md "General chat").
    idle_decay: float = 0.998
    # Tuning. Pseudo-observations behind a prior rate (Rate.strength), since 1f407e8.
    prior_strength: float = 2.0
    # Tuning. Prior acceptance of the draft model (first position, later positions:
    # later ones are reached only after accepted ones, and acceptances come in runs).
    # Since 1f407e8; the default pair's measured acceptance is 0.66-0.88
    # (docs/benchmarks.md "Context lookup, proposed on evidence").
    model_prior: tuple[float, float] = (0.7, 0.8)
    # Tuning. Prior acceptance of a lookup that matched 1, 2 and 3 or more tokens.
    # Modest on purpose (62bd362): a lookup is scored for free in every round that does
    # not propose it, and optimistic priors bought wide calls for failing lookups on a
    # compute-bound target (summarize Q4_K_M sampled 0.93 -> 1.01 of plain).
    lookup_priors: tuple[tuple[float, float], ...] = ((0.2, 0.6), (0.4, 0.7), (0.6, 0.8))
    # Tuning. Prior acceptance of a suffix-index match of 4-7, 8-15 and 16 or more
    # tokens (plans.SUFFIX_CLASSES; issue 54's suffix drafter): the shortest class is
    # most often served text that is not this one's, so no surer than a 2-token lookup to
    # begin with; the longer ones as a 3-token lookup. Scored for free like a lookup.
    suffix_priors: tuple[tuple[float, float], ...] = ((0.4, 0.7), (0.5, 0.8), (0.6, 0.8))
    # Structural. Tokens a grammar forces are always accepted.
    forced_prior: tuple[float, float] = (1.0, 1.0)
    # Tuning. Bins of the draft's confidence its per-confidence acceptance is kept in,
    # each with the bin's midpoint as its prior (1f407e8).
    confidence_bins: int = 10

    # -- Prices (curve.Curve, estimates.Prices) ------------------------------------------
    # Tuning. A size is priced from the last `recent` ratios (call over prior) of its band,
    # else of all calls. 46942c1: a median of 8 kept drafting at 0.61x plain under a busy
    # neighbour; the capped mean of the same 8 follows it within a few calls
    # (docs/results/neighbour-stall).
    recent: int = 8
    # Tuning. Ratios in a band price it where this many are among the last `fresh` calls.
    band_quorum: int = 3
    # Tuning. Each ratio is held to this many times their median, so one descheduled
    # call moves the price by a fraction (46942c1).
    spike: float = 4.0
    # Tuning. Per draft call: the share of draft calls hidden under a target call (the
    # overlap) follows the last few dozen calls (093b64f).
    hidden_decay: float = 0.95
    # Tuning. Weight of an exponential average of each sequence's own work between calls
    # (sampling, verifying, bookkeeping); since 1f407e8.
    work_weight: float = 0.2

    # -- The goodput guard (estimates.Goodput) -------------------------------------------
    # Tuning. Rounds of evidence before a drafting kind is barred at a batch size: 64a1741
    # raised it from 3.5 after the guard barred the model on the warm-up's four
    # budget-cut rounds (demo BF16: -k auto 0.94x plain before, 1.45x after).
    evidence: float = 6.0
    # Tuning. A barred kind is tried again once its decayed evidence falls below this:
    # at goodput_decay, about 35 rounds after the bar.
    unbar: float = 3.0
    # Tuning. Decayed plain rounds needed beside that evidence: a plain rate to hold
    # drafting to (46942c1).
    recent_plain: float = 0.5
    # Tuning. Where drafting is all a size plays, a plain round is asked for once the
    # plain evidence decays below this: at goodput_decay, about one round in sixty.
    probe: float = 0.3
    # Tuning. Decay per round of the guard's sums: a memory of about fifty rounds (46942c1).
    goodput_decay: float = 0.98

    # -- How long answers run (estimates.AnswerLength) -----------------------------------
    # Tuning. Weight of the average answer length over finished sequences (1f407e8).
    answer_weight: float = 0.3
    # Tuning. The fewest tokens an answer is expected still to emit, once it has outrun
    # typical answers and while it is short (1f407e8).
    answer_floor: float = 8.0

    # -- The calibration, the prior of the prices (calibrate.py) -------------------------
    # Tuning. Timed calls per size, the median kept; the draft's steps and first calls
    # are timed as many times. fa12b74: one timed call per size priced 2 tokens at 1.9x
    # 3 on a BF16 target.
    reps: int = 3
    # Tuning. The draft's reading of unread text is timed at these two sizes. 64a1741:
    # a 118-token prompt priced from one cold 16-token call at 609 ms against about 370
    # ms measured withheld the draft model (demo BF16 0.94x plain).
    read_chunk: int = 16
    read_long: int = 128
    # Tuning. Tokens the calibration times calls on before any prompt is known (the ids
    # do not change what a call costs).
    probe_tokens: int = 32
    # Tuning. A batch's widest call is timed itself where the ladder of sizes (steps of
    # 1.33-1.5x) falls short of it by more than this factor (39b274d).
    wide_slack: float = 1.25
    # Tuning. The server's default slots: the fewest within this factor of the best
    # throughput n / T(n). 73d32f4: the step rule it replaced chose 8 on a curve whose
    # best was 4 (1970a76 for the curves measured).
    slot_gain: float = 1.05
    # Tuning. The most slots --parallel auto chooses among (serve/cli.py loads for as many).
    most_slots: int = 8

    # -- Derived --------------------------------------------------------------------------
    @property
    def fresh(self) -> int:
        """Calls a band's ratios must be among to price it: twice `recent` (46942c1)."""
        return 2 * self.recent

    @property
    def catch_up_chunks(self) -> tuple[int, ...]:
        """Catch-up chunk sizes: powers of two from the calibration's read_chunk (priced
        from a measurement there) to catch_up_largest."""
        sizes, size = [], self.read_chunk
        while size <= self.catch_up_largest:
            sizes.append(size)
            size *= 2
        return tuple(sizes)

    def __post_init__(self) -> None:
        if self.k_max < 1:
            raise ValueError(f"k_max must be >= 1, got {self.k_max}")
        for name in ("acceptance_decay", "idle_decay", "hidden_decay", "goodput_decay"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {getattr(self, name)}")
        if not self.catch_up_chunks:
            raise ValueError(f"catch_up_largest ({self.catch_up_largest}) is below read_chunk ({self.read_chunk})")


PLANNER = PlannerConfig()
