"""The llama-server peer: its request and the parser, on answers captured from the
real server (llama-server built from llama-cpp-python 0.3.16's vendored llama.cpp,
Qwen2.5-Coder 1.5B target, 0.5B draft, K = 3, HumanEval/0 as a raw completion)."""

import json
from pathlib import Path

import pytest

from specsample.bench.modes import SETTINGS
from specsample.bench.tasks import HUMANEVAL_STOPS

from benchmarks.native import (LlamaServer, LlamaServerMode, build_llama_server_modes, completion_request,
                               llama_server_argv, parse_completion)

from bench_helpers import FakeServer

pytestmark = pytest.mark.pure

FIXTURES = Path(__file__).parent / "fixtures"


def _captured(setting):
    return json.loads((FIXTURES / f"llama_server_completion_{setting}.json").read_text())


def test_parse_greedy_answer_stopped_by_a_stop_string():
    parsed = parse_completion(_captured("greedy"))
    stats = parsed["stats"]
    assert parsed["stop_reason"] == "stop_string" and parsed["text"].startswith("    for i in range(len(numbers)):")
    assert stats["new_tokens"] == len(parsed["token_ids"]) == 43
    assert (stats["drafted"], stats["accepted"]) == (27, 25) and stats["acceptance_rate"] == pytest.approx(25 / 27)
    assert stats["prefill_seconds"] == pytest.approx(0.920465) and stats["decode_seconds"] == pytest.approx(1.95323)
    assert stats["prompt_tokens_evaluated"] == 118  # the slot was erased: a full prefill


def test_parse_sampled_answer_ended_by_eos():
    parsed = parse_completion(_captured("sample"))
    assert parsed["stop_reason"] == "eos" and parsed["stats"]["new_tokens"] == 24
    assert (parsed["stats"]["drafted"], parsed["stats"]["accepted"]) == (18, 11)


def test_parse_plain_answer_without_draft_counts():
    response = _captured("greedy")
    del response["timings"]["draft_n"], response["timings"]["draft_n_accepted"]  # as without speculation
    response["stop_type"] = "limit"
    stats = parse_completion(response)["stats"]
    assert stats["drafted"] == 0 and stats["acceptance_rate"] is None
    assert parse_completion(response)["stop_reason"] == "length"


def test_request_fixes_k_and_turns_llama_cpp_extras_off():
    body = completion_request([1, 2, 3], 384, SETTINGS["sample"], 7, HUMANEVAL_STOPS, 3)
    assert body["prompt"] == [1, 2, 3] and body["n_predict"] == 384 and body["seed"] == 7
    assert body["stop"] == list(HUMANEVAL_STOPS)
    assert (body["temperature"], body["top_p"], body["top_k"], body["min_p"]) == (0.8, 0.95, 0, 0.0)
    assert (body["speculative.n_max"], body["speculative.n_min"], body["speculative.p_min"]) == (3, 0, 0.0)
    assert body["repeat_penalty"] == 1.0 and body["dry_multiplier"] == 0.0 and body["cache_prompt"]
    greedy = completion_request([1], 8, SETTINGS["greedy"], 0, (), None)
    assert greedy["top_k"] == 1 and greedy["speculative.n_max"] == 0  # plain decoding on the same server


def test_server_mode_runs_through_the_parser():
    server = FakeServer(answer=_captured("greedy"))
    out = LlamaServerMode("llamacpp-spec-k3", server, 3).run([5, 6], 384, SETTINGS["greedy"], 0, HUMANEVAL_STOPS)
    assert out.stop_reason == "stop_string" and out.stats["new_tokens"] == 43 and len(out.token_ids) == 43
    assert server.bodies[0]["speculative.n_max"] == 3


def test_build_modes_skips_the_native_peer_with_its_reason():
    modes, skipped = build_llama_server_modes(["llamacpp-spec"], [3], None, no_server="cmake not found")
    assert modes == [] and skipped == ["llamacpp-spec: cmake not found"]
    modes, _ = build_llama_server_modes(["llamacpp-server", "llamacpp-spec"], [3], FakeServer(answer=_captured("greedy")))
    assert [m.name for m in modes] == ["llamacpp-server", "llamacpp-spec-k3"]
    assert [m.family for m in modes] == ["llamacpp-server", "llamacpp-spec"]


def test_hf_stop_criterion_looks_only_at_new_text():
    import torch

    from benchmarks.peers import _StopStrings

    class Chars:
        def decode(self, ids):
            return "".join(chr(i) for i in ids)

    prompt = [ord(c) for c in "def f():\n"]  # the prompt's own "\ndef"-like text must not count
    stop = _StopStrings(Chars(), len(prompt), HUMANEVAL_STOPS)
    body = [ord(c) for c in "    return 1\n"]
    assert not stop(torch.tensor([prompt + body]), None).item()
    assert stop(torch.tensor([prompt + body + [ord(c) for c in "def"]]), None).item()


def test_every_speculative_request_starts_on_an_empty_draft_context():
    """llama.cpp's draft keeps its context across requests and hands back an earlier
    answer to the same prompt as a free draft; before each measured -md request the
    server is sent a short request whose first token is in neither the new prompt nor
    the last request's text, which empties it. Plain requests need none."""
    class Recorder(LlamaServer):
        def __init__(self):  # no process: record what would be sent
            self.sent = []

        def request(self, route, body=None):
            self.sent.append((route, body))
            return _captured("greedy") if route == "/completion" and body.get("n_predict") != 4 else {}

    server = Recorder()
    answer = _captured("greedy")["tokens"]
    for k in (3, None, 4):
        server.complete(completion_request([5, 6, 1000], 384, SETTINGS["greedy"], 0, HUMANEVAL_STOPS, k))
    routes = [route for route, _ in server.sent]
    erase = "/slots/0?action=erase"
    assert routes == [erase, "/completion", erase, "/completion",  # K = 3: flush, then the request
                      erase, "/completion",  # plain: the request alone
                      erase, "/completion", erase, "/completion"]  # K = 4
    flushes = [body for route, body in server.sent if route == "/completion" and body["n_predict"] == 4]
    assert len(flushes) == 2 and all(body["speculative.n_max"] > 0 for body in flushes)
    first = flushes[1]["prompt"][0]
    assert first not in (5, 6, 1000) and first not in answer  # matches nothing the draft may hold


def test_llama_server_divides_its_context_among_slots_so_each_slot_keeps_n_ctx():
    argv = llama_server_argv("llama-server", "t.gguf", "d.gguf", port=8080, tmp="/tmp/x", threads=2, n_ctx=1000,
                             k_max=4, parallel=4)
    flag = {name: argv[argv.index(name) + 1] for name in ("-m", "-md", "-c", "-cd", "-np", "--draft-max", "-t")}
    assert flag == {"-m": "t.gguf", "-md": "d.gguf", "-c": "4000", "-cd": "1000", "-np": "4", "--draft-max": "4",
                    "-t": "2"}
    one = llama_server_argv("llama-server", "t.gguf", "d.gguf", port=8080, tmp="/tmp/x", threads=2, n_ctx=1000,
                            k_max=4)
    assert one[one.index("-c") + 1] == "1000" and one[one.index("-np") + 1] == "1"


def test_every_llama_server_slot_forgets_its_prompt_and_draft_before_a_load():
    class Recorder(LlamaServer):
        def __init__(self, parallel):  # no process: record what would be sent
            self.parallel, self.sent = parallel, []

        def request(self, route, body=None):
            self.sent.append((route, body))
            return {}

    server = Recorder(3)
    server.reset([[5, 1000], [999, 7]])
    routes = [route for route, _ in server.sent]
    assert routes == ["/completion", "/slots/0?action=erase", "/completion", "/slots/1?action=erase",
                      "/completion", "/slots/2?action=erase"]
    flushes = [body for route, body in server.sent if route == "/completion"]
    assert [body["id_slot"] for body in flushes] == [0, 1, 2]  # each slot's own draft context
    assert all(body["speculative.n_max"] > 0 and body["prompt"][0] not in (5, 1000, 999, 7) for body in flushes)
