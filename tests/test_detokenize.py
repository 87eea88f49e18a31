"""Incremental decoding must give exactly what decoding all the tokens gives, on
tokenizers that write a token differently depending on its neighbours."""

import random

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from specsample.output.detokenize import TextTracker

from toy import ByteTokenizer

pytestmark = pytest.mark.pure


def word_level(words, decoder=None, **kw):
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)} | {"[UNK]": len(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if decoder is not None:
        tok.decoder = decoder
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", **kw), len(words)


def random_ids(name, vocab, rng):
    if name == "bytes" and rng.random() < 0.7:  # whole characters of 1 to 4 bytes, split into tokens
        return [b for _ in range(rng.randint(1, 12)) for b in rng.choice("ab é€😀").encode()]
    return [rng.randrange(vocab) for _ in range(rng.randint(1, 30))]


def random_stops(text, rng):
    """Up to two pieces of the text, some of which will match."""
    if not text or rng.random() < 0.4:
        return ()
    pieces = {text[i : i + rng.randint(1, 4)] for i in rng.sample(range(len(text)), min(2, len(text)))}
    return tuple(p for p in pieces if "\ufffd" not in p)


TOKENIZERS = {
    # Spaces between words, removed before punctuation by the clean-up.
    "words": lambda: word_level(["the", "cat", ".", "n't", "do", ",", "'s"], clean_up_tokenization_spaces=True),
    # SentencePiece-style: "▁" is a space, dropped at the very start of a text.
    "metaspace": lambda: word_level(["▁the", "▁cat", "s", "▁", "é", "▁do"], decoders.Metaspace()),
    # One token per byte: characters of 2 to 4 bytes are split across tokens.
    "bytes": lambda: (ByteTokenizer(), 256),
}


def reference(tokenizer, ids, stops):
    """Tokens consumed and text, decoding everything after every token."""
    for n in range(1, len(ids) + 1):
        text = tokenizer.decode(ids[:n])
        hits = [text.find(s) for s in stops if s in text]
        if hits:
            return n, text[: min(hits)]
    return len(ids), tokenizer.decode(ids)


def run(tokenizer, ids, stops, rng):
    tracker, chunks, n = TextTracker(tokenizer, stops), [], 0
    for token in ids:
        n += 1
        if tracker.add(token):
            break
        if rng.random() < 0.4:  # a round ends here
            chunks.append(tracker.take())
    chunks += [tracker.take(), tracker.flush()]
    assert "".join(chunks) == tracker.final()
    return n, tracker.final(), chunks


@pytest.mark.parametrize("name", TOKENIZERS)
def test_incremental_text_equals_decoding_everything(name):
    tokenizer, vocab = TOKENIZERS[name]()
    rng = random.Random(0)
    for _ in range(300):
        ids = random_ids(name, vocab, rng)
        full = tokenizer.decode(ids)
        stops = random_stops(full, rng)
        n, text, chunks = run(tokenizer, ids, stops, rng)
        assert (n, text) == reference(tokenizer, ids, stops)
        if "\ufffd" not in full:  # no chunk ends inside a character
            assert not any("\ufffd" in c for c in chunks)
