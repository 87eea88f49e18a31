"""Rules that end a generation by its text, beside stop strings: what an editor asks of
a middle (llama-server's `n_indent` and `t_max_predict_ms`, which llama.vim sends).

A rule is called with the whole text so far and where its new part starts, once per
piece of decoded text (one token's, as a rule needs: the tracker decodes token by token
when there is one), and returns where the text ends, or None to go on. It never cuts
into text already handed out: it fires on the first piece that breaks it. The tokens
past the cut are still counted as generated (llama-server counts them too).
"""

from __future__ import annotations

import time
from collections.abc import Callable

TextStop = Callable[[str, int], "int | None"]


class IndentStop:
    """Every line after the first is indented by at least `columns` spaces or tabs: the
    text ends before the first other character of a line that is indented less (an
    empty line too, as llama-server has it), keeping that line's indentation."""

    def __init__(self, columns: int):
        if columns < 1:
            raise ValueError(f"an indentation rule needs at least 1 column, got {columns}")
        self.columns = columns

    def __call__(self, text: str, start: int) -> int | None:
        line = text.find("\n", max(0, text.rfind("\n", 0, start)))  # the newline that opens the first line to check
        while line >= 0:
            at = line + 1
            while at < len(text) and text[at] in " \t":
                at += 1
            if at < len(text) and at - line - 1 < self.columns:
                return at
            line = text.find("\n", line + 1)
        return None


class TimeStop:
    """After `seconds` from the first piece of text, the text ends at the next piece
    that holds a newline (llama-server's t_max_predict_ms: an editor's suggestion stops
    at a whole line once its time is up)."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic):
        self.seconds, self.clock = seconds, clock
        self.began: float | None = None

    def __call__(self, text: str, start: int) -> int | None:
        now = self.clock()
        if self.began is None:
            self.began = now
        if "\n" in text[start:] and now - self.began > self.seconds:
            return len(text)
        return None
