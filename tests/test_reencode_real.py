"""The re-encoding cache on the real draft: llama.cpp's own Q4_0 file rewritten with its
source's key by the gguf package still loads and scores."""

import pytest

from specsample.backends import reencode
from specsample.backends.gguf_header import gguf_metadata

pytestmark = pytest.mark.real


def test_the_real_draft_re_encoded_carries_its_key_and_loads(real_pair):
    """The gguf package's rewrite of a real llama.cpp-quantized file (Q4_0 blocks, the
    tokenizer's arrays) is a file llama.cpp loads and that generates as the copy did."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    from specsample.backends import load_backend
    from specsample.backends.models import resolve

    model = resolve(real_pair.draft, fetch=False)
    backend = load_backend(real_pair.draft, "llamacpp", quant="q4_0", threads=1)
    # The key read from the header as every load reads it (test_reencode.py checks that
    # the gguf package reads the same; its reader parses the whole vocabulary, ~10 s here).
    assert gguf_metadata(backend.path)[reencode.SOURCE_KEY] == model.sha256
    assert reencode.file_type(backend.path) == "q4_0"
    ids = backend.tokenizer.encode("def fizzbuzz(n):")
    assert backend.score(ids, num_logits=1).isfinite().all()
