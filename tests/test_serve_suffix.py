"""The server's suffix index: a request drafts from the text of the requests served
before it under the same cache_salt, and from no other salt's."""

import httpx
import pytest

from serve_helpers import running, toy_app

pytestmark = pytest.mark.system

PROMPT = "the cat sat on a mat and the dog ran"


def suffix_accepted(answer) -> int:
    sources = answer["usage"]["speculative"]["sources"]
    return sum(s["accepted"] for name, s in sources.items() if name.startswith("suffix"))


def test_a_second_request_drafts_from_the_first_ones_answer_under_its_own_salt_alone():
    app, _ = toy_app(drafter="suffix", eos=False)  # the suffix drafter alone, K = 3
    with running(app) as url:
        def complete(**fields):
            r = httpx.post(url + "/v1/completions", timeout=30, json={
                "model": "toy", "prompt": PROMPT, "max_tokens": 24, "seed": 1, "temperature": 1.0, **fields})
            assert r.status_code == 200, r.text
            return r.json()

        first, second, other = complete(), complete(), complete(cache_salt="tenant-b")
        # Seeded, the verifier is coupled: the same text whatever was drafted.
        assert first["choices"][0]["text"] == second["choices"][0]["text"] == other["choices"][0]["text"]
        # The second drafts the first's answer from its first round on (its first token is
        # a free plain step; then 3 drafts and a bonus token a round: 18 of 24 are drafts);
        # another salt finds nothing served and drafts as the first did.
        assert suffix_accepted(second) >= 15 and suffix_accepted(second) > suffix_accepted(first)
        assert suffix_accepted(other) == suffix_accepted(first)
