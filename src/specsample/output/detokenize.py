"""The text of generated tokens as they come, cut at the first stop string or where a
text rule (text_stops.py) ends it.

Decoding the whole output again every round (or every token, to look for stop
strings) is quadratic in its length. Instead each new token is decoded in a short
window, as vLLM's detokenizer does: its text is what decoding the window adds to
decoding the window without the new tokens. The window starts at the tokens whose
text came out last time, so a tokenizer that writes a token differently at the
start of a text (SentencePiece drops the leading space) sees it in context. Text
ending in "\ufffd" is held back: the last token may hold the first bytes of a
character that the next one completes.

Example, one token per byte of "é€" (c3 a9 e2 82 ac):

    tokens so far    window            decodes to    comes out
    c3               c3                "\ufffd"      nothing yet
    c3 a9            c3 a9             "é"           "é"
    .. e2            c3 a9 e2          "é\ufffd"     nothing yet
    .. e2 82         c3 a9 e2 82       "é\ufffd"     nothing yet
    .. e2 82 ac      c3 a9 e2 82 ac    "é€"          "€" (next window: e2 82 ac ...)
"""

from __future__ import annotations

from .text_stops import TextStop


class TextTracker:
    def __init__(self, tokenizer, stop_strings: tuple[str, ...], rules: tuple[TextStop, ...] = ()):
        self.tokenizer = tokenizer  # None: no text, only tokens
        self.stop_strings = stop_strings
        self.rules = rules
        self.ids: list[int] = []
        self.prefix = 0  # first token of the decoding window
        self.read = 0  # first token whose text has not come out of the window
        self.taken: list[str] = []  # text handed out
        self.pending = ""  # text decoded but not handed out yet
        self.stopped = False  # a stop string was found or a rule fired; pending ends there
        self.stopped_by: str | None = None  # "stop_string" or "limit" (a rule)

    def add(self, token: int) -> bool:
        """Append one token; True once a stop string has appeared or a rule fired."""
        self.ids.append(token)
        if self.stop_strings or self.rules:  # else decoding can wait for take()
            self._decode(final=False)
        return self.stopped

    def take(self) -> str:
        """Text not yet handed out that can no longer change: all of it but a tail
        that could still grow into a stop string."""
        self._decode(final=False)
        keep = 0 if self.stopped else self._stop_prefix_length()
        return self._hand_out(len(self.pending) - keep)

    def flush(self) -> str:
        """Whatever was held back, once no more tokens will come."""
        self._decode(final=True)
        return self._hand_out(len(self.pending))

    def final(self) -> str:
        return "".join(self.taken) + self.pending

    def _decode(self, final: bool) -> None:
        if self.tokenizer is None or self.stopped or self.read == len(self.ids):
            return
        before = self.tokenizer.decode(self.ids[self.prefix : self.read])
        after = self.tokenizer.decode(self.ids[self.prefix :])
        if not final and (len(after) <= len(before) or after.endswith("\ufffd")):
            return  # nothing new yet, or a character still incomplete
        self.prefix, self.read = self.read, len(self.ids)
        self._append(after[len(before) :])

    def _append(self, text: str) -> None:
        start = len(self.pending)
        self.pending += text
        # A match cannot start in text already handed out (take() holds back any tail
        # that begins one), nor end before the new text.
        ends = [(at, "stop_string") for stop in self.stop_strings
                if (at := self.pending.find(stop, max(0, start - len(stop) + 1))) >= 0]
        if self.rules:
            handed = sum(map(len, self.taken))
            whole = "".join(self.taken) + self.pending
            ends += [(max(at, handed) - handed, "limit") for rule in self.rules
                     if (at := rule(whole, handed + start)) is not None]
        if ends:
            end, self.stopped_by = min(ends)
            self.pending = self.pending[:end]
            self.stopped = True

    def _stop_prefix_length(self) -> int:
        """Length of the longest tail of pending that is a proper prefix of a stop string."""
        longest = 0
        for stop in self.stop_strings:
            for j in range(min(len(stop) - 1, len(self.pending)), longest, -1):
                if self.pending.endswith(stop[:j]):
                    longest = j
                    break
        return longest

    def _hand_out(self, end: int) -> str:
        out, self.pending = self.pending[:end], self.pending[end:]
        self.taken.append(out)
        return out
