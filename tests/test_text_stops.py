"""Rules that end a text (text_stops.py): llama-server's n_indent and t_max_predict_ms
as llama.vim relies on them. The rule cuts where llama-server's loop cuts; under
speculation a seeded answer with a rule is the same answer without it, cut there; the
clock rule ends on a whole line once its time is up."""

import pytest

from specsample.decoding.drafters import ModelDrafter
from specsample.decoding.generate import GenerationConfig, generate
from specsample.decoding.sampling import SamplingConfig
from specsample.output.detokenize import TextTracker
from specsample.output.text_stops import IndentStop, TimeStop

from toy import BYTE_EOS, BYTE_PIECES, PieceTokenizer, byte_backend

pytestmark = pytest.mark.pure


def llama_server_indent(pieces, columns):
    """llama-server's n_indent check as its slot loop runs it, one token's text at a
    time (it looks one token late and moves one line per token): the text it keeps,
    or None if it never fires."""
    text, last_nl, has_new_line = "", 0, False
    for piece in pieces:
        text += piece
        if has_new_line:
            if last_nl > 0:
                pos = last_nl
                while pos < len(text) and text[pos] in " \t":
                    pos += 1
                if pos < len(text) and pos - last_nl < columns:
                    return text[:pos]
            found = text.find("\n", last_nl)
            if found >= 0:
                last_nl = found + 1
        if "\n" in piece:
            has_new_line = True
    return None


def ours(pieces, columns):
    rule, text = IndentStop(columns), ""
    for piece in pieces:
        start = len(text)
        text += piece
        if (at := rule(text, start)) is not None:
            return text[:at]
    return None


@pytest.mark.parametrize("pieces,columns,kept", [
    (["def f():", "\n", "    ", "return 1", "\n", "x = 2"], 4, "def f():\n    return 1\n"),
    (["x = 1", "\n", "  ", "y"], 4, "x = 1\n  "),  # the short line's indentation stays
    (["x", "\n", "\n", "    y"], 2, "x\n"),  # an empty line counts as indented by nothing
    (["if a:", "\n", "\tb", "\n", "\t c"], 1, None),
    (["first line at column 0 is fine", "\n", "  ok"], 2, None),
])
def test_the_indentation_rule_cuts_where_llama_server_cuts(pieces, columns, kept):
    assert ours(pieces, columns) == kept
    # llama-server reaches the same cut, a token or a line later: give it tokens to go on.
    # Where ours keeps every piece, the line "more" at column 0 ends the text for both.
    padded = pieces + ["\n", "more", "\n", "end"]
    whole = "".join(pieces) + "\n"
    assert llama_server_indent(padded, columns) == ours(padded, columns) == (whole if kept is None else kept)


def test_a_tracker_cuts_its_text_at_the_rule_and_says_so():
    tracker = TextTracker(PieceTokenizer(BYTE_PIECES, BYTE_EOS), (), (IndentStop(4),))
    for token in "x = 1\n  y = 2".encode():
        if tracker.add(token):
            break
    assert tracker.final() == "x = 1\n  " and tracker.stopped_by == "limit"


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_the_time_rule_waits_for_a_newline_after_its_time():
    clock = Clock()
    rule = TimeStop(0.5, clock)
    assert rule("a\n", 0) is None  # the first piece starts the clock
    clock.now = 0.6
    assert rule("a\nbc", 2) is None  # time is up, but no newline in this piece
    assert rule("a\nbc\nd", 4) == len("a\nbc\nd")  # the piece with the newline is kept whole


BIASED = SamplingConfig(temperature=0.9, logit_bias={BYTE_PIECES.index(b"\n"): 4.0, BYTE_PIECES.index(b" "): 3.0})


@pytest.mark.parametrize("seed", range(12))
def test_a_seeded_answer_with_the_rule_is_the_answer_without_it_cut_there(seed):
    target, draft = byte_backend(0), byte_backend(1, "draft")
    config = GenerationConfig(max_new_tokens=60, sampling=BIASED, seed=seed, eos_token_ids=frozenset())
    whole = generate(target, [5, 6], config, ModelDrafter(draft, BIASED), 3)
    ruled = generate(target, [5, 6], GenerationConfig(**{**config.__dict__, "text_stops": (IndentStop(2),)}),
                     ModelDrafter(draft, BIASED), 3)
    at = IndentStop(2)(whole.text, 0)
    if at is None:
        assert ruled.text == whole.text and ruled.stop_reason == "length"
    else:
        assert ruled.text == whole.text[:at] and ruled.stop_reason == "limit"
        assert ruled.token_ids == whole.token_ids[:len(ruled.token_ids)]


def test_some_seeds_are_cut():
    target = byte_backend(0)
    cut = 0
    for seed in range(12):
        config = GenerationConfig(max_new_tokens=60, sampling=BIASED, seed=seed, eos_token_ids=frozenset(),
                                  text_stops=(IndentStop(2),))
        cut += generate(target, [5, 6], config).stop_reason == "limit"
    assert cut >= 3  # the comparison above is not vacuous
