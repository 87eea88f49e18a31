"""`specsample serve` parses into the server's settings and serves a tiny HF model;
tokenizers render multi-turn chats."""

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import uvicorn
from transformers import PreTrainedTokenizerFast

from specsample.app.arguments import draft_length
from specsample.backends.hf import HFTokenizer
from specsample.cli import main
from specsample.decoding.plans import FixedK
from specsample.policy.make import check_draft_length

from serve_helpers import running
from test_cli import WORDS, save_tiny

pytestmark = pytest.mark.system


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    words = ["[UNK]", "[EOS]"] + WORDS + [f"w{i}" for i in range(90 - 2 - len(WORDS))]
    return save_tiny(tmp_path_factory.mktemp("serve-model") / "target", 0, words)


def test_draft_length_is_auto_or_an_integer_and_bad_ones_are_refused():
    assert draft_length("auto") == "auto" and draft_length("3") == 3
    for bad in ("0", "-2", "many"):
        with pytest.raises(ValueError, match="k must be"):
            check_draft_length(draft_length(bad))


@pytest.mark.parametrize("args,message", [
    (["--max-queue", "0"], "--max-queue must be positive"),
    (["--queue-timeout", "nan"], "--queue-timeout must be positive and finite"),
    (["--queue-timeout", "inf"], "--queue-timeout must be positive and finite"),
    (["--port", "70000"], "--port must be in"),
    (["--target", "no-such-model"], "unknown model"),
    (["--parallel", "0"], "--parallel must be at least 1"),
    (["--parallel", "many"], "--parallel must be 'auto' or a number"),
    # the door flags (test_serve_security.py)
    (["--max-connections", "0"], "--max-connections must be positive"),
    (["--body-timeout", "nan"], "--body-timeout must be positive and finite"),
    (["--send-timeout", "inf"], "--send-timeout must be positive and finite"),
    (["--keep-alive-timeout", "-1"], "--keep-alive-timeout must be positive"),
    (["--allowed-hosts", " , "], "--allowed-hosts is empty"),
])
def test_bad_options_are_one_line_and_exit_2(capsys, monkeypatch, args, message):
    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: pytest.fail("must not start"))
    assert main(["serve", "--draft", "ngram", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_serve_loads_the_models_and_binds_to_loopback(monkeypatch, tiny_target):
    started = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: started.update(app=app, **kw))
    assert main(["serve", "--target", tiny_target, "--draft", "ngram", "-k", "2", "--max-queue", "3"]) == 0
    assert started["host"] == "127.0.0.1" and started["port"] == 8000
    settings = started["app"].state.server.settings
    assert (settings.policy.k_max, settings.max_queue, settings.api_key) == (2, 3, None)
    assert isinstance(settings.policy, FixedK)  # -k 2 built the server's policy
    with running(started["app"]) as url:
        body = {"model": settings.model_name, "prompt": "the cat sat on", "max_tokens": 6, "temperature": 0}
        r = httpx.post(url + "/v1/completions", json=body, timeout=30)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 6
        r = httpx.post(url + "/v1/chat/completions", timeout=30,
                       json={"model": settings.model_name, "messages": [{"role": "user", "content": "the cat"}]})
        assert r.status_code == 400 and "no chat template" in r.json()["error"]["message"]


def test_serve_parallel_holds_its_slots_behind_the_api_key(monkeypatch, tiny_target):
    """--parallel 2 on the transformers backend (a cache per sequence): the worker has
    two slots, two clients with the key are answered at once, one without it is not."""
    started = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: started.update(app=app, **kw))
    assert main(["serve", "--target", tiny_target, "--draft", "ngram", "--parallel", "2",
                 "--api-key", "a-long-enough-secret-key"]) == 0
    server = started["app"].state.server
    assert server.settings.parallel == 2 and len(server.worker.slots) == 2
    body = {"model": server.settings.model_name, "prompt": "the cat sat on", "max_tokens": 6, "temperature": 0}
    with running(started["app"]) as url:
        assert httpx.post(url + "/v1/completions", json=body, timeout=30).status_code == 401
        key = {"Authorization": "Bearer a-long-enough-secret-key"}
        with ThreadPoolExecutor(2) as pool:
            replies = list(pool.map(lambda _: httpx.post(url + "/v1/completions", json=body, headers=key,
                                                         timeout=60), range(2)))
    assert [r.status_code for r in replies] == [200, 200]
    assert replies[0].json()["choices"][0]["text"] == replies[1].json()["choices"][0]["text"]


def test_serve_traces_every_round_of_its_requests(monkeypatch, tiny_target, tmp_path):
    """--trace on a server of two slots under -k auto: its two requests' rounds, a
    batch's round in one line, add up to the tokens it answered."""
    path, replies, written = tmp_path / "trace.jsonl", [], []

    def serve(app, **options):  # uvicorn.run's place: the requests come while the command runs
        body = {"model": app.state.server.settings.model_name, "prompt": "the cat sat on the mat the cat",
                "max_tokens": 8, "temperature": 0}
        with running(app) as url, ThreadPoolExecutor(2) as pool:
            replies.extend(pool.map(lambda _: httpx.post(url + "/v1/completions", json=body, timeout=60), range(2)))
        written.append(path.read_text())  # flushed line by line: all there while the server still runs

    monkeypatch.setattr(uvicorn, "run", serve)
    assert main(["serve", "--target", tiny_target, "--draft", "ngram", "--parallel", "2", "--trace", str(path)]) == 0
    assert [r.status_code for r in replies] == [200, 200]
    assert written == [path.read_text()]
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert sum(s["emitted"] for line in lines for s in line["seqs"]) == sum(
        r.json()["usage"]["completion_tokens"] for r in replies)
    assert {s["seat"] for line in lines for s in line["seqs"]} <= {0, 1}  # a seat per slot
    assert main(["serve", "--target", tiny_target, "-k", "3", "--trace", str(path)]) == 2  # no planner to trace


def test_hf_chat_messages_renders_every_turn(tiny_target):
    hf = PreTrainedTokenizerFast.from_pretrained(tiny_target)
    hf.chat_template = ("{% for m in messages %}{{ m.role }} {{ m.content }} {% endfor %}"
                        "{% if add_generation_prompt %}dog{% endif %}")
    tok = HFTokenizer(hf)
    messages = [{"role": "system", "content": "the cat"}, {"role": "user", "content": "sat on"}]
    assert tok.chat_messages(messages) == tok.encode("system the cat user sat on dog")
    assert tok.chat_prompt("a mat") == tok.chat_messages([{"role": "user", "content": "a mat"}])


def test_a_chat_template_that_refuses_the_messages_is_a_400(monkeypatch, tiny_target):
    """A template's own raise_exception (roles must alternate, no system turn, ...) is
    the client's input being refused, not a server failure."""
    started = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: started.update(app=app, **kw))
    assert main(["serve", "--target", tiny_target, "--draft", "ngram"]) == 0
    server = started["app"].state.server
    server.target.tokenizer.hf.chat_template = "{{ raise_exception('Conversation roles must alternate') }}"
    with running(started["app"]) as url:
        r = httpx.post(url + "/v1/chat/completions", timeout=30,
                       json={"model": server.settings.model_name, "messages": [{"role": "user", "content": "the"}]})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == "messages" and "Conversation roles must alternate" in error["message"]
        assert "/v1/completions" not in error["message"]  # the model has a template: it refused these messages
