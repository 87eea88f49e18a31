"""The planner's decision trace (`--trace FILE`): one JSON line per round, and the
summary `specsample trace FILE` prints from it.

A `Trace` hangs on a Planner (`planner.trace`); with none there the planner does no
work for it beyond one `is not None` test per plan, call and report. It hears three
things, in this order for every round (batching.py and control.py say who calls
what when):

    planned   Planner.plan: every sequence's offer, the prices, each option the
              sequence had, priced with the others' choices held, and the choice
    called    Planner.record: each model call of the round (the target's closes it)
    reported  Seat.observe: what each sequence's round drafted, accepted and emitted

and writes the round's line once every sequence planned in it has reported, flushed,
so that a server killed mid-run leaves every finished round readable. A round that
was never planned (the last token of a budget: nothing to choose) still reports: it
joins the round being filled, else it gets a line of its own (`"why": "last"`), so
the trace's tokens are the run's. Model calls made while no round is open (a
newcomer's prompt, alone in its call) belong to no line.

A line, abridged:

    {"round": 7, "t": 1.52, "load": 0, "barred": [], "probe": false, "kind": "model",
     "prices": {"target": {"1": 0.021, "4": 0.024}, "draft": {"1": 0.004}, "own": [0.001, 0.002],
                "hidden": 0.0},
     "predicted": {"tokens": 2.71, "seconds": 0.037},
     "seqs": [{"seat": 0, "seq": 1, "offer": {"model": 8, "ngram2": 3}, "lag": 1, "stalls": false,
               "options": [["plain", 0, 1.0, 0.022, 45.4], ["model", 1, 1.8, 0.028, 64.2], ...],
               "chosen": ["model", 3], "catch_up": 0, "why": "priced higher", "left_out": {},
               "drafted": 3, "accepted": 2, "emitted": 3, "seconds": 0.036}],
     "target": {"calls": 1, "tokens": 4, "seconds": 0.025, "prompt": false},
     "draft": {"calls": 3, "seconds": 0.011, "hidden": 0.0, "reading": 0.0},
     "seconds": 0.038}

An option is [source, drafts, expected tokens, expected seconds of the round, the
round's expected tokens per second]; `seconds` is the realised round: from the end of
the previous target call (or the sequence's start) to the end of this one's, as the
planner times its rounds. With a real clock the trace's own work (pricing every
option, writing the line) falls inside the rounds it times, so a traced run can
decide differently from an untraced one where prices sit near a tie; on a fake clock
(tests/test_trace.py) the two are the same run.
"""

from __future__ import annotations

import contextlib
import json
import threading
import weakref
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ..decoding.plans import MODEL
from .estimates import kind_of

KINDS = ("plain", "catch-up", "lookup", "suffix", "model")  # what a round did, most telling last
WHY_PLAIN = {
    "priced lower": "every drafting option priced at fewer tokens per second",
    "barred": "the goodput guard barred what was offered",
    "probe": "the goodput guard asked for a plain round (to time plain steps again)",
    "stalls": "the draft model had unread text to read first",
    "nothing offered": "nothing to draft from",
    "last": "the budget's last token: nothing to plan",
}


class Trace:
    """The sink a Planner writes its rounds to: a path (opened now, truncated) or an
    open text file. Safe to share between threads (a server plans on its worker
    thread; a lock keeps each line whole)."""

    def __init__(self, out: str | Path | object, tag: str | None = None):
        self._file = open(out, "w", encoding="utf-8") if isinstance(out, (str, Path)) else out
        self._owned = isinstance(out, (str, Path))
        self.tag = tag  # written into every line (bench: the target type)
        self._lock = threading.Lock()
        self._seats: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # seat -> [number, sequences begun]
        self._numbered = 0  # seats numbered so far (a server's: one a slot; generate_many's: one a sequence)
        self._round: dict | None = None  # the round being filled
        self._loose: dict = _calls()  # calls heard while no round was open
        self.rounds = 0

    def begun(self, seat) -> None:
        with self._lock:
            self._name(seat)[1] += 1

    def planned(self, planner, offers: dict, load: int, barred: set, menus: list, chosen: list, plans: dict) -> None:
        entry = _planned(planner, offers, load, barred, menus, chosen, plans)
        with self._lock:
            if self._round is not None:  # a round some sequence never reported (its stream failed)
                self._write(self._round, incomplete=True)
            entry["seqs"] = [dict(zip(("seat", "seq"), self._name(seat)), **line)
                             for seat, line in zip(offers, entry["seqs"])]
            entry["waiting"] = {id(seat) for seat in offers}
            entry["by_seat"] = dict(zip(map(id, offers), entry["seqs"]))
            self._round = entry

    def called(self, call, seconds: float | None = None) -> None:
        """A model call; `seconds`, for a target call: the round's, ended by it."""
        with self._lock:
            into = self._round if self._round is not None else self._loose
            _add_call(into, call, seconds)

    def reported(self, seat, report) -> None:
        realised = {"drafted": len(report.sources), "accepted": report.num_accepted,
                    "emitted": len(report.emitted_tokens), "seconds": _r(report.round_seconds),
                    "target_tokens": report.target_tokens}
        with self._lock:
            entry = self._round
            if entry is None:  # an unplanned round with no planned one open: a line of its own
                entry, self._loose = {"t": None, "seqs": [], **self._loose}, _calls()
            line = entry.get("by_seat", {}).get(id(seat))
            if line is None:
                number, seq = self._name(seat)
                # Unplanned: a stream's first token, which a held row predicts (Offer.free:
                # no call), or the budget's last, with no room for a draft.
                line = {"seat": number, "seq": seq, "chosen": None, "why": "last" if report.target_tokens else "free"}
                entry["seqs"].append(line)
            line.update(realised)
            entry.get("waiting", set()).discard(id(seat))
            if not entry.get("waiting"):
                self._write(entry)

    def close(self) -> None:
        with self._lock:
            if self._round is not None:
                self._write(self._round, incomplete=True)
            if self._owned:
                self._file.close()
            else:
                self._file.flush()

    def _name(self, seat) -> list[int]:
        if seat not in self._seats:
            self._seats[seat], self._numbered = [self._numbered, 0], self._numbered + 1
        return self._seats[seat]

    def _write(self, entry: dict, incomplete: bool = False) -> None:
        if entry is self._round:
            self._round = None
        entry.pop("waiting", None)
        entry.pop("by_seat", None)
        lines = entry["seqs"]
        window = entry.pop("window")
        if entry["target"]["calls"] and window is not None:
            entry["seconds"] = _r(window)
        else:  # no call of its own: its own clock, unless its call was another round's (a batch)
            shared = any(line.get("target_tokens") for line in lines)
            entry["seconds"] = 0.0 if shared else max((line.get("seconds") or 0.0 for line in lines), default=0.0)
        for line in lines:
            line.pop("target_tokens", None)
        entry["kind"] = round_kind(lines)
        if incomplete:
            entry["incomplete"] = True
        head = {"round": self.rounds, **({"tag": self.tag} if self.tag is not None else {})}
        self._file.write(json.dumps({**head, **entry}) + "\n")
        self._file.flush()
        self.rounds += 1


def _calls() -> dict:
    return {"target": {"calls": 0, "tokens": 0, "seconds": 0.0, "prompt": False},
            "draft": {"calls": 0, "seconds": 0.0, "hidden": 0.0, "reading": 0.0}, "window": None}


def _add_call(into: dict, call, seconds: float | None) -> None:
    if call.target:
        target = into["target"]
        target["calls"] += 1
        target["tokens"] += call.tokens
        target["seconds"] = _r(target["seconds"] + call.seconds)
        target["prompt"] |= call.prompt
        if seconds is not None:
            into["window"] = (into["window"] or 0.0) + seconds
    else:
        draft = into["draft"]
        draft["calls"] += 1
        key = "hidden" if call.hidden else "seconds"
        draft[key] = _r(draft[key] + call.seconds)
        if call.prompt:  # it read text (a catch-up chunk, or a drafting round's lag)
            draft["reading"] = _r(draft["reading"] + call.seconds)


def _planned(planner, offers: dict, load: int, barred: set, menus: list, chosen: list, plans: dict) -> dict:
    """A plan's part of the line: what each sequence could do and what it cost."""
    prices, seats = planner.prices, list(offers)
    sizes, seqs = set(), []
    probe = planner.goodput.probe(len(seats) + (load > 0))
    for i, (seat, menu) in enumerate(zip(seats, menus)):
        offer, options = offers[seat], []
        for option in menu:
            trial = chosen[:i] + [option] + chosen[i + 1:]
            seconds = planner.seconds(trial, load)
            sizes.add(load + sum(o.m + 1 for o in trial))
            options.append([_name(option.source), option.m, _r(option.expected, 4), _r(seconds),
                            _r(sum(o.expected for o in trial) / max(seconds, 1e-9), 4)])
        plan, model = plans[seat], MODEL in offer.available
        seqs.append({"offer": {str(s): n for s, n in offer.available.items()}, "lag": offer.lag,
                     "reading": _r(seat.reading(offer)) if model else None,
                     "stalls": seat.stalls(offer) if model else None,
                     "options": options, "chosen": [_name(plan.source), plan.length], "catch_up": plan.catch_up,
                     "why": _why(offer, menu, chosen[i], barred, probe, seat),
                     "left_out": _left_out(offer, menu, barred, seat)})
    return {"t": _r(planner.clock()), "load": load, "barred": sorted(barred), "probe": probe,
            "prices": {"target": {str(n): _r(prices.target(n)) for n in sorted(sizes)},
                       "draft": {str(n): _r(prices.draft(n)) for n in range(1, len(seats) + 1)},
                       "own": [_r(prices.own(False)), _r(prices.own(True))], "hidden": _r(prices.draft.hidden, 4)},
            "predicted": {"tokens": _r(sum(o.expected for o in chosen), 4),
                          "seconds": _r(planner.seconds(chosen, load))},
            "seqs": seqs, **_calls()}


def _why(offer, menu: list, option, barred: set, probe: bool, seat) -> str:
    """Why the sequence drafts or steps plain this round."""
    if option.m:
        return "priced higher"
    if len(menu) > 1:
        return "priced lower"
    offered = [s for s, n in offer.available.items() if n > 0]
    if not offered:
        return "nothing offered"
    if probe:
        return "probe"
    if any(kind_of(s) in barred for s in offered):
        return "barred"
    return "stalls" if MODEL in offered and seat.stalls(offer) else "nothing offered"


def _left_out(offer, menu: list, barred: set, seat) -> dict[str, str]:
    """The sources offered that were not on the menu, and why."""
    on_menu = {o.source for o in menu}
    return {str(s): "barred" if kind_of(s) in barred else "stalls" if s == MODEL and seat.stalls(offer) else "none"
            for s, n in offer.available.items() if n > 0 and s not in on_menu}


def round_kind(lines: list[dict]) -> str:
    """What a round did: drafted from the model if any sequence did, else from the
    suffix index, else from a lookup, else read unread text for the draft (catch-up), else a plain step."""
    kinds = {"plain"}
    for line in lines:
        chosen = line.get("chosen")
        if chosen and chosen[1]:
            kinds.add(_kind_named(chosen[0]))
        elif line.get("catch_up"):
            kinds.add("catch-up")
    return max(kinds, key=KINDS.index)


def _kind_named(name: str) -> str:
    """The kind of a source by the name a line gives it (str(Source)): model, suffix or lookup."""
    return "model" if name == "model" else "suffix" if name.startswith("suffix") else "lookup"


def _name(source) -> str:
    return "plain" if source is None else str(source)


def _r(x: float | None, digits: int = 6) -> float | None:
    return None if x is None else round(x, digits)


# The summary: a pure function of the lines, and its table.


@dataclass
class KindRow:
    rounds: int = 0
    seconds: float = 0.0
    tokens: int = 0
    priced: int = 0  # rounds with a prediction and a realised time of their own
    predicted: float = 0.0  # their predicted seconds, summed
    realised: float = 0.0  # and their realised seconds
    predicted_tokens: float = 0.0
    priced_tokens: int = 0


@dataclass
class TraceSummary:
    rounds: int = 0
    sequence_rounds: int = 0  # a round of a batch of n counts n
    tokens: int = 0
    seconds: float = 0.0
    incomplete: int = 0
    by_kind: dict[str, KindRow] = field(default_factory=dict)
    why_plain: Counter = field(default_factory=Counter)  # sequence rounds by reason (WHY_PLAIN)
    drafted_from: Counter = field(default_factory=Counter)  # sequence rounds that drafted, by source
    gain: float = 0.0  # summed over those: predicted rate of the round chosen over the same round with it plain
    catch_up_tokens: int = 0
    reading_seconds: float = 0.0  # the draft reading unread text, every round
    catch_up_seconds: float = 0.0  # of which in catch-up rounds


def summarise(lines) -> TraceSummary:
    """The trace's rounds added up (lines: the parsed JSON objects)."""
    out = TraceSummary()
    for line in lines:
        kind, seconds = line["kind"], line["seconds"]
        emitted = sum(s.get("emitted", 0) for s in line["seqs"])
        row = out.by_kind.setdefault(kind, KindRow())
        row.rounds += 1
        row.seconds += seconds
        row.tokens += emitted
        out.rounds += 1
        out.sequence_rounds += len(line["seqs"])
        out.tokens += emitted
        out.seconds += seconds
        out.incomplete += bool(line.get("incomplete"))
        predicted = line.get("predicted")
        if predicted is not None and line["target"]["calls"] and not line.get("incomplete"):
            row.priced += 1
            row.predicted += predicted["seconds"]
            row.realised += seconds
            row.predicted_tokens += predicted["tokens"]
            row.priced_tokens += emitted
        reading = line["draft"]["reading"]
        out.reading_seconds += reading
        if kind == "catch-up":
            out.catch_up_seconds += reading
        for seq in line["seqs"]:
            out.catch_up_tokens += seq.get("catch_up", 0)
            if seq["why"] == "priced higher":
                out.drafted_from[_kind_named(seq["chosen"][0])] += 1
                out.gain += _gain(seq)
            else:
                out.why_plain[seq["why"]] += 1
    return out


def _gain(seq: dict) -> float:
    """The chosen option's predicted rate over the plain option's, in the same round."""
    rates = {(o[0], o[1]): o[4] for o in seq["options"]}
    plain, chosen = rates.get(("plain", 0)), rates.get(tuple(seq["chosen"]))
    return chosen / plain - 1 if plain and chosen is not None else 0.0


def format_summary(s: TraceSummary) -> str:
    """The summary as markdown tables."""
    if not s.rounds:
        return "no rounds traced"
    out = [f"{s.rounds} rounds ({s.sequence_rounds} sequence rounds), {s.tokens} tokens in {s.seconds:.3f} s"
           + (f"; {s.incomplete} incomplete (a sequence never reported)" if s.incomplete else ""), "",
           "| round kind | rounds | seconds | share of time | tokens / round | predicted s / round "
           "| realised s / round | price error | predicted tokens / round |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for kind in sorted(s.by_kind, key=KINDS.index, reverse=True):
        row = s.by_kind[kind]
        share = row.seconds / s.seconds if s.seconds else 0.0
        priced = "| - | - | - | - |"
        if row.priced and row.predicted:
            priced = (f"| {row.predicted / row.priced:.4f} | {row.realised / row.priced:.4f} "
                      f"| {row.realised / row.predicted - 1:+.1%} | {row.predicted_tokens / row.priced:.2f} |")
        out.append(f"| {kind} | {row.rounds} | {row.seconds:.3f} | {share:.1%} | {row.tokens / row.rounds:.2f} "
                   + priced)
    out += ["", "| why a sequence's round was plain | sequence rounds |", "|---|---:|"]
    out += [f"| {WHY_PLAIN.get(why, why)} | {n} |" for why, n in s.why_plain.most_common()]
    drafted = sum(s.drafted_from.values())
    out += ["", "| drafted from | sequence rounds |", "|---|---:|"]
    out += [f"| {source} | {n} |" for source, n in s.drafted_from.most_common()]
    if drafted:
        out.append(f"\nDrafting was chosen where it priced higher than a plain step: by {s.gain / drafted:+.1%} in "
                   f"expected tokens per second on average.")
    out.append(f"\nCatch-up: {s.catch_up_tokens} tokens of unread text read in rounds that drafted nothing from the "
               f"model, {s.catch_up_seconds:.3f} s of draft calls in the plain ones; the draft read unread text for "
               f"{s.reading_seconds:.3f} s in all ({s.reading_seconds / s.seconds if s.seconds else 0.0:.1%} of the "
               f"time).")
    out.append("\nPrice error: realised over predicted seconds, less one, summed over the rounds that made a target "
               "call of their own (realised: from the previous target call's end to this one's).")
    return "\n".join(out)


def read_lines(path: str | Path) -> tuple[list[dict], int]:
    """A trace file's lines, and how many could not be read (a line cut off when the
    process writing it was killed)."""
    lines, bad = [], 0
    with open(path, encoding="utf-8") as f:
        for text in f:
            if text.strip():
                try:
                    lines.append(json.loads(text))
                except json.JSONDecodeError:
                    bad += 1
    return lines, bad



def traced(policy, out: str | Path | None, tag: str | None = None):
    """A Trace writing to `out` on the planner of `policy` (a seat of one: -k auto),
    for as long as the `with` lasts; for no `out`, a context that does nothing."""
    if out is None:
        return contextlib.nullcontext()
    planner = getattr(policy, "planner", None)
    if planner is None:
        raise ValueError("--trace follows -k auto's decisions; this run's draft length is fixed (or nothing drafts)")
    return _attached(planner, Trace(out, tag))


@contextlib.contextmanager
def _attached(planner, trace: Trace):
    """The trace on the planner while the `with` lasts; then off it (a round after
    that is not traced) and closed."""
    planner.trace = trace
    try:
        yield trace
    finally:
        planner.trace = None
        trace.close()
