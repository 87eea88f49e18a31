"""A replay of the bench's greedy answers: the real generation loop and the real planner
(-k auto), with the models replaced by recordings and the clock by a cost model, so a
run is deterministic and a cell's 13 answers replay in about a second of CPU
(benchmarks/sensitivity.py varies the planner's numbers on it).

Recordings (`record`): for each answer the bench measured (a record of mode "ar" with
its token ids), the prompt, the target's greedy answer, and one teacher-forced pass of
the real draft model over prompt + answer: at each answer position the draft's argmax
and its probability. Greedy speculation then accepts exactly the drafts up to the
draft's first miss, since the draft's chain is the target's text until then; the
confidences after a miss (on text the draft wrote itself) are approximated by the
teacher-forced ones at the same position. Token ids are remapped to a small
vocabulary of those that occur in a run (a row is a few thousand floats, not 151,936).

What a replay does not model: real timing noise (a seeded noise is the stand-in), the
overlap path (RPC placement), sampling (greedy only: a sampled draft's acceptance is
not determined by its argmax), the draft's real tokens after a miss (they never count),
a round's own work beyond a constant (replay-data/costs.json: own_work, the median the
chat runs recorded), and the calibration itself (its numbers change what is measured,
not how the planner plans: the priors here are the same measurement the costs come
from, so only the noise sets prices apart from priors).
"""

from __future__ import annotations

import gzip
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

import torch

from specsample.app.assemble import make_drafter
from specsample.backends.base import Backend
from specsample.decoding.generate import GenerationConfig, generate, generate_many
from specsample.decoding.sampling import SamplingConfig
from specsample.policy.calibrate import measured_prices
from specsample.policy.config import PlannerConfig
from specsample.policy.control import Planner
from specsample.policy.curve import interpolated

DATA = Path(__file__).parent / "replay-data"
RECORDINGS = DATA / "recordings.json.gz"
COSTS = DATA / "costs.json"
RUNS = {"chat-bf16": "docs/results/chat-bf16/records.jsonl.gz", "chat-q4_k_m": "docs/results/chat-q4_k_m-free/records.jsonl"}


def read_records(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def record(root: Path, draft_path: Path, threads: int = 2) -> list[dict]:
    """The recordings of every run in RUNS: its "ar" answers, with the real draft
    model's teacher-forced argmax and top probability at each answer position."""
    from specsample.backends.llamacpp import load_llamacpp
    from specsample.bench.tasks import load_task

    draft = load_llamacpp(draft_path, threads=threads)
    prompts = {p.id: p for p in load_task("chat")}
    out = []
    for run, relative in RUNS.items():
        for r in read_records(root / relative):
            if r["mode"] != "ar" or "token_ids" not in r:
                continue
            prompt = draft.tokenizer.chat_prompt(prompts[r["prompt_id"]].text)
            if len(prompt) != r["prompt_tokens"]:
                raise ValueError(f"{run} {r['prompt_id']}: prompt of {len(prompt)} tokens, the record's {r['prompt_tokens']}")
            answer = r["token_ids"]
            draft.rollback(0)
            rows = draft.score(prompt + answer[:-1], num_logits=len(answer)).float()  # [len(answer), vocab]
            probs = torch.softmax(rows, dim=-1)
            top, argmax = probs.max(dim=-1)
            out.append({"run": run, "prompt_id": r["prompt_id"], "kind": r.get("kind"), "prompt": prompt,
                        "answer": answer, "stop_reason": r["stop_reason"], "max_new_tokens": r["max_new_tokens"],
                        "draft": argmax.tolist(), "confidence": [round(float(p), 4) for p in top]})
    return out


@dataclass
class Recording:
    """One answer in a small vocabulary shared by its run (load_recordings)."""

    prompt_id: str
    prompt: list[int]
    answer: list[int]
    draft: list[int]  # the draft's argmax at each answer position
    confidence: list[float]  # its probability there
    eos: int
    max_new_tokens: int

    @property
    def text(self) -> list[int]:
        return self.prompt + self.answer

    @staticmethod
    def remapped(raw: dict, ids: dict[int, int]) -> Recording:
        """`raw` (a saved recording) in the ids of `ids` (token id -> small id), which
        grows with the tokens it has not seen."""
        for t in [*raw["prompt"], *raw["answer"], *raw["draft"]]:
            ids.setdefault(t, len(ids))
        return Recording(raw["prompt_id"], [ids[t] for t in raw["prompt"]], [ids[t] for t in raw["answer"]],
                         [ids[t] for t in raw["draft"]], raw["confidence"], ids[QWEN_EOS[0]], raw["max_new_tokens"])


QWEN_EOS = (151645, 151643)  # <|im_end|>, <|endoftext|>: small ids 0 and 1 (ReplayModel.eos_token_ids)


def load_recordings(run: str, path: Path = RECORDINGS) -> list[Recording]:
    """A run's recordings, in one small vocabulary (vocab_size: the largest id + 1)."""
    ids = {t: i for i, t in enumerate(QWEN_EOS)}
    with gzip.open(path, "rt") as f:
        return [Recording.remapped(r, ids) for r in json.load(f) if r["run"] == run]


class Clock:
    """Modelled time: it moves only when a replay backend is called or a round's own
    work is charged."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Costs:
    """Seconds of a call from a calibration's measurement (calibrate.measure's keys):
    the target by tokens scored (interpolated, and on past the last measured size at
    the slope of the last two), the draft by tokens fed (a step, a 16-token read, a
    128-token read). `noise`: a seeded generator's lognormal factor on every call, and
    `busy`: stretches in which a neighbour doubles every call (a run of calls of
    random length, entered with probability `busy` per call)."""

    def __init__(self, measured: dict, noise: float = 0.0, busy: float = 0.0, seed: int = 0):
        self.target_points = sorted({**dict(enumerate(measured["target"], start=1)),
                                     **{int(n): s for n, s in measured.get("target_wide", {}).items()}}.items())
        step, token = measured["draft_step"], measured["draft_token"]
        self.draft_points = [(1, step), (16, step + 15 * token), (128, measured["draft_long"])]
        self.own = measured["own_work"]
        self.noise, self.busy, self.rng = noise, busy, random.Random(seed)
        self.busy_left = 0

    def factor(self) -> float:
        f = math.exp(self.rng.gauss(0.0, self.noise)) if self.noise else 1.0
        if self.busy:
            if self.busy_left == 0 and self.rng.random() < self.busy:
                self.busy_left = self.rng.randint(10, 60)
            if self.busy_left:
                self.busy_left -= 1
                f *= 2.0
        return f

    def target(self, tokens: int) -> float:
        return interpolated(self.target_points, tokens) * self.factor()

    def draft(self, tokens: int) -> float:
        return interpolated(self.draft_points, tokens) * self.factor()


class ReplayModel(Backend):
    """`sequences` sequences of one replayed model, each holding token ids. A sequence
    that starts afresh is matched to the recording whose prompt its first call begins
    (a slot serves one answer after another); a row after a text is the recording's at
    that position. The target's row picks the recorded answer (greedy decoding replays
    it exactly); the draft's has the recorded argmax at the recorded probability.
    Every call advances the clock by its cost, and the target's rollback, which ends
    each round, by a round's own work (sampling, verifying, bookkeeping)."""

    def __init__(self, recordings: list[Recording], clock: Clock, costs: Costs, target: ReplayModel | None = None,
                 sequences: int = 1):
        # A draft (`target` given) plays, on each sequence, what its target's same sequence plays:
        # its first call, a catch-up chunk of the chat template, cannot tell the prompts apart.
        self.recordings, self.clock, self.costs, self.target = recordings, clock, costs, target
        self.is_draft = target is not None
        self.sequences = sequences
        self.name = "replay-draft" if self.is_draft else "replay-target"
        self.vocab_size = 1 + max(max(r.text + r.draft) for r in recordings)
        self.eos_token_ids = frozenset({0, 1})  # Recording.remapped numbers Qwen's two first
        self.context_length = 1 << 20
        self.tokenizer = None
        self.held: list[list[int]] = [[] for _ in range(sequences)]
        self.playing: list[Recording | None] = [None] * sequences
        self.calls = 0

    @property
    def length(self) -> int:
        return len(self.held[0])

    def sequence_length(self, seq: int) -> int:
        return len(self.held[seq])

    def cached_tokens(self) -> list[int]:
        return list(self.held[0])

    def sequence_tokens(self, seq: int) -> list[int]:
        return list(self.held[seq])

    def rollback(self, length: int) -> None:
        self.rollback_sequence(0, length)

    def rollback_sequence(self, seq: int, length: int) -> None:
        del self.held[seq][length:]
        if not self.is_draft:
            self.clock.now += self.costs.own

    def score(self, token_ids: list[int], num_logits: int) -> torch.Tensor:
        return self.score_many([(0, token_ids, num_logits)])[0]

    def score_many(self, requests: list[tuple[int, list[int], int]]) -> list[torch.Tensor]:
        tokens = sum(len(ids) for _, ids, _ in requests)
        self.clock.now += self.costs.draft(tokens) if self.is_draft else self.costs.target(tokens)
        self.calls += 1
        out = []
        for seq, ids, num_logits in requests:
            if not self.held[seq]:
                self.playing[seq] = self.match(ids) if self.target is None else self.target.playing[seq]
            self.held[seq] += ids
            n = len(self.held[seq])
            out.append(torch.stack([self.row(self.playing[seq], at) for at in range(n - num_logits, n)])
                       if num_logits else torch.empty(0, self.vocab_size))
        return out

    def match(self, ids: list[int]) -> Recording:
        found = [r for r in self.recordings if r.prompt[: len(ids)] == ids]
        if len(found) != 1:
            raise ValueError(f"{len(found)} recordings fit the {len(ids)} tokens of a new sequence")
        return found[0]

    def row(self, rec: Recording, at: int) -> torch.Tensor:
        """Logits [vocab] after the first at + 1 tokens of `rec`'s text (the draft's
        own text past a miss: the same position's recorded row)."""
        i = at + 1 - len(rec.prompt)  # the answer position this row predicts
        logits = torch.zeros(self.vocab_size)
        if not self.is_draft:  # rows after a missed draft are never read: the position alone decides
            logits[rec.answer[i] if 0 <= i < len(rec.answer) else rec.eos] = 30.0
            return logits
        i = min(max(i, 0), len(rec.draft) - 1)
        p = min(max(rec.confidence[i], 1e-6), 1 - 1e-6)
        logits.fill_(min(math.log((1 - p) / (self.vocab_size - 1)), math.log(p) - 1e-3))
        logits[rec.draft[i]] = math.log(p)
        return logits


@dataclass
class Played:
    """What a cell's replay cost: modelled seconds (whole requests, and decode alone:
    prefill left out), tokens emitted and target calls made."""

    seconds: float
    decode_seconds: float
    tokens: int
    target_calls: int

    @property
    def tokens_per_call(self) -> float:
        return self.tokens / self.target_calls


def greedy_config(rec: Recording) -> GenerationConfig:
    return GenerationConfig(max_new_tokens=rec.max_new_tokens, sampling=SamplingConfig(temperature=0.0), seed=0)


def planner_seat(measured: dict, config: PlannerConfig, clock: Clock):
    """A seat of a planner whose priors are the measurement, as make_policy makes it
    once calibrated (the calibration itself is not replayed)."""
    return Planner(config.k_max, measured_prices(measured, config), clock, config=config).seat()


def replay_drafter(draft: Backend, clock: Clock):
    drafter = make_drafter(draft, SamplingConfig(temperature=0.0), lookup=True)
    drafter.model.clock = clock  # it times its own calls
    return drafter


def check_replayed(rec: Recording, token_ids: list[int]) -> None:
    if token_ids != rec.answer:
        raise AssertionError(f"{rec.prompt_id}: the replay emitted another answer than the recorded one")


def play_single(recordings: list[Recording], costs: Costs, measured: dict, config: PlannerConfig) -> Played:
    """Each answer in turn, alone, with one planner for them all (as the bench's
    -k auto mode keeps its seat across prompts)."""
    clock = Clock()
    seat = planner_seat(measured, config, clock)
    seconds = decode = 0.0
    tokens = calls = 0
    for rec in recordings:
        target = ReplayModel([rec], clock, costs)
        draft = ReplayModel([rec], clock, costs, target)
        result = generate(target, rec.prompt, greedy_config(rec), replay_drafter(draft, clock), seat, clock)
        check_replayed(rec, result.token_ids)
        stats = result.stats
        seconds += stats.total_seconds
        decode += stats.total_seconds - stats.prefill_seconds
        tokens, calls = tokens + stats.new_tokens, calls + stats.target_calls
    return Played(seconds, decode, tokens, calls)


def play_batch(recordings: list[Recording], costs: Costs, measured: dict, config: PlannerConfig,
               sequences: int = 4) -> Played:
    """Every answer through `sequences` slots at once (continuous batching, the
    scheduler's calls, one planner): the serve cell. Decode seconds are not told apart
    from prompt chunks in a shared call, so they are the whole time here too."""
    clock = Clock()
    target = ReplayModel(recordings, clock, costs, sequences=sequences)
    draft = ReplayModel(recordings, clock, costs, target, sequences)
    seat = planner_seat(measured, config, clock)
    results, stats = generate_many(target, [r.prompt for r in recordings], [greedy_config(r) for r in recordings],
                                   draft, lambda slot: replay_drafter(slot, clock), seat, clock=clock)
    for rec, result in zip(recordings, results):
        check_replayed(rec, result.token_ids)
    tokens = sum(r.stats.new_tokens for r in results)
    return Played(clock.now, clock.now, tokens, stats.target_calls)
