"""Every number the planner (-k auto) decides with, in one place (docs/planner.md has
them as tables, with the runs that set them).

- PlannerConfig: the tuning numbers, the ones a sensitivity study moved (half or
  double changed some replayed cell past 2%: docs/results/planner-sensitivity) or that
  only an unreplayed cell could judge. Each says why it is what it is and what set it.
  Its properties are the numbers derived from them, computed, never set on their own.
  PLANNER is the one every run uses; a study passes another (make.make_policy(config=
  ...), Planner(config=...)) to the planner and its estimates.
- The constants below it: numbers no study moved (each says which run showed it), and
  facts of the code (varying them would break a promise, not tune a trade-off).
- CalibrationConfig: how the prices' prior is measured and how many slots a server
  opens, not how a measured planner plans: the measurement is cached on disk per
  machine and model pair, and every call of a run moves the prices away from it.
"""

from __future__ import annotations

from dataclasses import dataclass

# A field's comment ends with a "Set by:" line: the command or commit whose result set
# it (tests/test_planner_config.py checks that every field has one). "The study" is
# `python -m benchmarks.sensitivity study` over the replay's four cells, each number at
# half and double (docs/results/planner-sensitivity: the tables, their commands).


@dataclass(frozen=True)
class PlannerConfig:
    # The most drafts a round proposes (--k-max). Rounds of up to 9 tokens: the best
    # fixed K on this repository's pairs was 2-6, so 8 leaves room above it for text
    # that copies. Half moved bf16-single 1.055 (no noise) and bf16-serve4 0.967.
    # Set by: 1f407e8; docs/benchmarks.md "-k auto against the best fixed K".
    k_max: int = 8
    # A draft model reads its unread text inside a drafting round while that costs at
    # most this many plain steps; past it, in chunks beside rounds that draft nothing
    # from it (plain steps, a lookup's drafts). Short HumanEval
    # answers lost 10% waiting for chunks when all reading went to chunks; a 100-token
    # prompt on one core cost more than four plain steps to read. Half moved bf16-single
    # 1.046 (1.056 without noise), busy 1.116.
    # Set by: 46942c1; docs/benchmarks.md (rpc-overlap); the study's `stall` row.
    stall: float = 4.0
    # No catch-up reading before this many tokens are out: the first tokens are what a
    # user waits for (issue 51). Double moved q4_k_m-serve4 0.970.
    # Set by: b3e2531; the study's `catch_up_after` row.
    catch_up_after: int = 2
    # Prior acceptance of the draft model (first position, later positions: a later one
    # is reached only after accepted ones, and acceptances come in runs); the default
    # pair's measured acceptance is 0.66-0.88. The study's largest mover: half, the
    # draft hardly tried (bf16-single 1.32, 1.40 without noise).
    # Set by: 1f407e8; docs/benchmarks.md "Context lookup, proposed on evidence".
    model_prior: tuple[float, float] = (0.7, 0.8)
    # Prior acceptance of a context lookup that matched 1, 2, and 3 or more tokens; a
    # suffix-index match takes one of these (estimates.prior). Modest on purpose: a
    # lookup is scored for free in every round that does not propose it, and optimistic
    # priors bought wide calls for failing lookups on a compute-bound target (summarize
    # Q4_K_M sampled 0.93 -> 1.01 of plain). Double moved bf16-serve4 1.062.
    # Set by: 62bd362; the study's `lookup_priors` row.
    lookup_priors: tuple[tuple[float, float], ...] = ((0.2, 0.6), (0.4, 0.7), (0.6, 0.8))
    # Bins of the draft's confidence its per-confidence acceptance is kept in, each
    # with the bin's midpoint as its prior. Double moved bf16-serve4 0.978.
    # Set by: 1f407e8; the study's `confidence_bins` row.
    confidence_bins: int = 10
    # A size is priced from the last `recent` ratios (call over prior) of its band, else
    # of all calls. A median of 8 kept drafting at 0.61x plain beside a busy neighbour;
    # the capped mean of the same 8 follows it within a few calls. Moved bf16-serve4
    # 1.019 / 0.978, busy bf16-single double 1.113.
    # Set by: 46942c1; docs/results/neighbour-stall; the study's `recent` row.
    recent: int = 8
    # Rounds of evidence (rounds in which the draft model read unread text are left out:
    # estimates.Goodput) before the goodput guard bars a drafting kind at a batch size:
    # raised from 3.5 after the guard barred the model on the warm-up's four budget-cut
    # rounds (demo BF16: -k auto 0.94x plain before, 1.45x after). Half moved
    # bf16-serve4 1.028. The guard's other thresholds are fractions of it (below).
    # Set by: 64a1741; the study's `evidence` row.
    evidence: float = 6.0
    # Per draft call: the share of draft calls hidden under a target call (the overlap
    # on RPC workers) follows the last few dozen calls. Kept as a tuning number because
    # only the RPC overlap cells can judge it and the replay has no overlap (the study's
    # row is flat by construction); no run compared other values.
    # Set by: 093b64f; docs/results/rpc-overlap.
    hidden_decay: float = 0.95

    # -- Derived: computed from the fields above, never set on their own -------------------
    @property
    def unbar(self) -> float:
        """A barred kind is tried again once its decayed evidence falls below half the
        evidence that barred it: about 35 rounds on at GOODPUT_DECAY (46942c1's 3.0)."""
        return self.evidence / 2

    @property
    def recent_plain(self) -> float:
        """Decayed plain rounds a bar needs beside the drafting kind's evidence, a plain
        rate to hold drafting to: a twelfth of it (46942c1's 0.5 at evidence 6)."""
        return self.evidence / 12

    @property
    def probe(self) -> float:
        """Where drafting is all a size plays, a plain round is asked for once plain
        evidence decays below a twentieth of the guard's evidence: about one round in
        sixty at GOODPUT_DECAY (46942c1's 0.3 at evidence 6)."""
        return self.evidence / 20

    @property
    def fresh(self) -> int:
        """Calls a band's ratios must be among to price it: twice `recent` (46942c1)."""
        return 2 * self.recent

    def __post_init__(self) -> None:
        if self.k_max < 1:
            raise ValueError(f"k_max must be >= 1, got {self.k_max}")
        if self.recent < 1 or self.confidence_bins < 1:
            raise ValueError(f"recent and confidence_bins must be >= 1, got {self.recent}, {self.confidence_bins}")
        if not 0 < self.hidden_decay <= 1:
            raise ValueError(f"hidden_decay must be in (0, 1], got {self.hidden_decay}")
        if not self.lookup_priors:
            raise ValueError("lookup_priors must hold at least one prior")


PLANNER = PlannerConfig()


# -- Constants: no study moved them ---------------------------------------------------------
# "No cell": half and double changed no replayed cell past 2% and its spread (the study,
# docs/results/planner-sensitivity), and, where the busy-neighbour cell's one seed said
# otherwise, 8 seeds a variant did not either (docs/planner.md "Constants").

# Joint "every sequence drafts L" starts of the batch search, beside all-plain: a move
# no sequence makes alone (b3e2531). Changed no plan in any cell, serve cells included.
JOINT_LENGTHS = (1, 2, 4)
# Passes of coordinate ascent (a pass that changes nothing stops it sooner; b3e2531).
# Changed no plan in any cell.
ASCENT_PASSES = 3
# The largest catch-up chunk; chunks run in powers of two from the calibration's
# read_chunk up to it (catch_up_chunks; b3e2531). Changed no plan in any cell.
CATCH_UP_LARGEST = 512
# Each price ratio is held to this many times their median, so one descheduled call
# moves a price by a fraction (46942c1). Changed no plan in any cell.
SPIKE = 4.0
# Ratios a band needs among its fresh calls to price it, else all calls do: the fewest
# whose median one spiked call cannot move (of two, the median is their mean, and SPIKE
# caps nothing). No cell.
BAND_QUORUM = 3
# Pseudo-observations behind a prior rate (1f407e8). No cell.
PRIOR_STRENGTH = 2.0
# Rounds an acceptance rate remembers (decay 1 - 1/10 a round observed; 1f407e8,
# 62e2a18). No cell.
ACCEPTANCE_MEMORY = 10
ACCEPTANCE_DECAY = 1 - 1 / ACCEPTANCE_MEMORY  # 0.9
# The goodput guard's memory, five acceptance memories (50 rounds, decay 0.98): it
# judges a source over longer than a run of misses that acceptance already follows
# (46942c1). No cell.
GOODPUT_DECAY = 1 - 1 / (5 * ACCEPTANCE_MEMORY)  # 0.98
# Decay a round a source sits out (Acceptance) and of a drafting kind's evidence per
# round of another kind (Goodput): ten guard memories (500 rounds, decay 0.998), so a
# source playing one round in twenty still gathers the guard's evidence (1b21100: chat
# Q4_K_M, -k auto 0.93x -> 0.97x plain). No cell.
IDLE_DECAY = 1 - 1 / (50 * ACCEPTANCE_MEMORY)  # 0.998
# Weight of the average of a sequence's own work between calls (1f407e8). No cell.
WORK_WEIGHT = 0.2
# Weight of the average answer length over finished sequences (1f407e8). No cell.
ANSWER_WEIGHT = 0.3
# The fewest tokens an answer is expected still to emit once it has outrun typical
# answers and while it is short (1f407e8). Changed no plan in any cell.
ANSWER_FLOOR = 8.0

# -- Facts of the code, not tuning ----------------------------------------------------------
# Tokens a grammar forces are always accepted: a forced draft is certain.
FORCED_PRIOR = (1.0, 1.0)


# -- The calibration (calibrate.py) ---------------------------------------------------------
@dataclass(frozen=True)
class CalibrationConfig:
    """How the prices' prior is measured, and how many slots a server opens by default:
    what is measured, not how a measured planner plans (the replay cannot vary them: it
    replays one measurement). The measurement is cached per machine and model pair
    (calibrate.cached_or_measured), and every call of a run moves the prices from it."""

    # Timed calls per size, the median kept; the draft's steps and first calls are timed
    # as many times. One timed call per size priced 2 tokens at 1.9x 3 on a BF16 target.
    # Set by: fa12b74.
    reps: int = 3
    # The draft's reading of unread text is timed at these two sizes (a catch-up chunk,
    # a prompt): its per-token cost falls as calls grow, and a 118-token prompt priced
    # from one cold 16-token call at 609 ms against about 370 ms measured withheld the
    # draft model (demo BF16 0.94x plain). read_chunk is also the smallest catch-up
    # chunk (priced from a measurement there); half and double moved no cell.
    # Set by: 64a1741; the study's `read_chunk` row.
    read_chunk: int = 16
    read_long: int = 128
    # Tokens calls are timed on before any prompt is known (the ids do not change what a
    # call costs; calibrate.repeated stretches them to any size timed).
    # Set by: none (no run compared other values).
    probe_tokens: int = 32
    # A batch's widest call is timed itself where the ladder of sizes (steps of
    # 1.33-1.5x) falls short of it by more than this factor.
    # Set by: 39b274d.
    wide_slack: float = 1.25
    # The server's default slots: the fewest within this factor of the best throughput
    # n / T(n). The step rule it replaced chose 8 on a curve whose best was 4.
    # Set by: 73d32f4; 1970a76 for the curves measured.
    slot_gain: float = 1.05
    # The most slots --parallel auto chooses among (serve/cli.py loads for as many).
    # Set by: 1970a76.
    most_slots: int = 8

    def __post_init__(self) -> None:
        if not 1 <= self.read_chunk <= CATCH_UP_LARGEST:
            raise ValueError(f"read_chunk must be in [1, {CATCH_UP_LARGEST}] (CATCH_UP_LARGEST), got {self.read_chunk}")


CALIBRATION = CalibrationConfig()


def catch_up_chunks(calibration: CalibrationConfig = CALIBRATION) -> tuple[int, ...]:
    """Catch-up chunk sizes: powers of two from the calibration's read_chunk (priced from
    a measurement there) to CATCH_UP_LARGEST."""
    sizes, size = [], calibration.read_chunk
    while size <= CATCH_UP_LARGEST:
        sizes.append(size)
        size *= 2
    return tuple(sizes)
