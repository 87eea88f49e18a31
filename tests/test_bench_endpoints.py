"""`bench serve --url`: endpoints named on the command line, their requests in OpenAI's
fields alone, loads sent in turning rounds, an endpoint that fails in one line, and
the whole command against a bare OpenAI-style endpoint (a local fake in the shape of
vLLM's stream, with none of our fields) and against our own server on a toy model."""

import contextlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from specsample.app.arguments import UsageError
from specsample.bench import endpoints as endpoints_module
from specsample.bench.endpoints import Endpoint, api_base, check_tasks, parse_endpoints, request_body, run_endpoints
from specsample.bench.records import RequestTiming, ServedRecord
from benchmarks.servers import free_port
from specsample.bench.load import Load
from specsample.bench.tasks import TASKS, Prompt
from specsample.cli import main

from serve_helpers import running, toy_app

FIRST_TEXT_DELAY = 0.05  # the fake endpoint's wait before its first content


class OpenAIEndpoint(ThreadingHTTPServer):
    """A bare OpenAI-compatible endpoint: /v1/models, and streamed /v1/chat/completions
    and /v1/completions answering `words` words, one a chunk, the first after
    FIRST_TEXT_DELAY, with OpenAI's usage chunk at the end and nothing of ours or
    llama-server's. Every request is appended to `log` as (name, path, body);
    `status`, when set, answers every route with it instead."""

    def __init__(self, name, log, words=4, status=None):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.name, self.log, self.words, self.status = name, log, words, status
        self.url = f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        if self._refused():
            return
        body = json.dumps({"object": "list", "data": [{"id": f"{self.server.name}-model", "object": "model"}]})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.log.append((self.server.name, self.path, body))
        if self._refused():
            return
        chat = self.path.endswith("/chat/completions")
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        words = min(self.server.words, body["max_tokens"])
        if chat:  # vLLM's first chunk: the role and no text
            self._send({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}, chat)
        time.sleep(FIRST_TEXT_DELAY)
        for i in range(words):
            text = f" w{i}"
            self._send({"choices": [{"index": 0, **({"delta": {"content": text}} if chat else {"text": text})}]}, chat)
        self._send({"choices": [{"index": 0, "finish_reason": "length", **({"delta": {}} if chat else {"text": ""})}]},
                   chat)
        self._send({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": words,
                                             "total_tokens": 3 + words}}, chat)
        self.wfile.write(b"data: [DONE]\n\n")

    def _refused(self):
        if self.server.status is None:
            return False
        self.send_response(self.server.status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps({"error": {"message": "engine down"}}).encode())
        return True

    def _send(self, chunk, chat):
        chunk = {"id": "x", "object": "chat.completion.chunk" if chat else "text_completion", "created": 0,
                 "model": self.server.name, **chunk}
        self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.flush()


@contextlib.contextmanager
def serving(*endpoints):
    threads = [threading.Thread(target=e.serve_forever, daemon=True) for e in endpoints]
    for t in threads:
        t.start()
    try:
        yield endpoints
    finally:
        for e in endpoints:
            e.shutdown()
            e.server_close()


def _prompts(n=2):
    return {"explain": [Prompt("explain", f"e{i}", f"explain {i}") for i in range(n)],
            "humaneval": [Prompt("humaneval", f"h{i}", f"def f{i}():") for i in range(n)]}


@pytest.mark.pure
@pytest.mark.parametrize("url,base", [("http://h:8000", "http://h:8000/v1"), ("http://h:8000/", "http://h:8000/v1"),
                                      ("http://h:8000/v1/", "http://h:8000/v1"),
                                      ("https://api.example.com/api/v1", "https://api.example.com/api/v1")])
def test_a_url_is_taken_as_the_api_base(url, base):
    assert api_base(url) == base


@pytest.mark.pure
def test_endpoints_are_named_by_label_or_host_and_port():
    assert parse_endpoints(["ours=http://127.0.0.1:8080", "http://10.0.0.2:8000/v1", "v.llm-2=https://x/v1"]) == [
        Endpoint("ours", "http://127.0.0.1:8080/v1"), Endpoint("10.0.0.2:8000", "http://10.0.0.2:8000/v1"),
        Endpoint("v.llm-2", "https://x/v1")]
    with pytest.raises(UsageError, match="names a more than once"):
        parse_endpoints(["a=http://h:1", "a=http://h:2"])
    with pytest.raises(UsageError, match=r"--url takes \[NAME=\]http\(s\)://host"):
        parse_endpoints(["localhost:8080"])


@pytest.mark.pure
def test_requests_carry_openai_fields_alone():
    chat = request_body("m", Prompt("explain", "e", "why?"), TASKS["explain"], 64, "sample", 3)
    assert chat == {"model": "m", "max_tokens": 64, "temperature": 0.8, "seed": 3, "top_p": 0.95,
                    "messages": [{"role": "user", "content": "why?"}]}
    raw = request_body("m", Prompt("humaneval", "h", "def f():"), TASKS["humaneval"], 64, "greedy", 0)
    assert raw == {"model": "m", "max_tokens": 64, "temperature": 0.0, "seed": 0,
                   "stop": ["\ndef", "\nclass", "\nif", "\nprint", "\n#"], "prompt": "def f():"}
    whole = ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"})
    asked = request_body("m", Prompt("prompts", "p", "Hi", messages=whole), TASKS["explain"], 8, "greedy", 0)
    assert asked["messages"] == list(whole)
    with pytest.raises(UsageError, match="the fim task is not one"):
        check_tasks({"fim": [Prompt("fim", "f", "a", suffix="b")]})


@pytest.mark.pure
def test_loads_go_round_the_endpoints_in_turning_order_and_are_recorded_per_repeat(monkeypatch):
    sent = []

    def run_load(api_base, bodies, clients, api_key="none"):
        sent.append((api_base, clients, len(bodies), bodies[0].get("max_tokens")))
        return [RequestTiming(i, 0.0, 0.1, 0.5, 4, finish_reason="length") for i in range(len(bodies))], 1.0

    monkeypatch.setattr(endpoints_module, "run_load", run_load)
    monkeypatch.setattr(endpoints_module, "connect", lambda e, key, name: Endpoint(e.name, e.api_base, "m"))
    named = [Endpoint(n, f"http://{n}/v1") for n in "ABC"]
    load = Load(_prompts(), ("greedy",), (1, 2), lambda task: 16, repeats=2)
    kept = []
    records, notes = run_endpoints(named, load, log=lambda msg: None, keep=kept.append)
    assert [s[3] for s in sent[:3]] == [8, 8, 8]  # a short warm-up request each
    rounds = ["".join(s[0][7] for s in sent[3 + 3 * i:6 + 3 * i]) for i in range(8)]
    assert rounds == ["ABC", "BCA", "CAB", "ABC", "BCA", "CAB", "ABC", "BCA"]  # 4 loads x 2 repeats
    assert [s[1] for s in sent[3::3]] == [1, 1, 2, 2] * 2
    assert len(records) == 3 * 4 * 2 * 2 and [r for done in kept for r in done] == records
    assert {(r.family, r.slots, r.k) for r in records} == {("endpoint", None, None)}
    assert [r.repeat for r in records if r.mode == "A" and r.prompt_id == "e0"] == [0, 0, 1, 1]
    assert notes == []


@pytest.mark.system
def test_an_endpoint_that_does_not_answer_is_one_line_naming_it():
    load = Load(_prompts(), ("greedy",), (1,), lambda task: 8)
    with serving(OpenAIEndpoint("up", []), OpenAIEndpoint("broken", [], status=500)) as (up, broken):
        with pytest.raises(UsageError) as listing:
            run_endpoints(parse_endpoints([f"up={up.url}", f"b={broken.url}"]), load, log=lambda msg: None)
        with pytest.raises(UsageError) as warm_up:  # a model named: nothing listed, and the warm-up is refused
            run_endpoints(parse_endpoints([f"b={broken.url}"]), load, model_name="m", log=lambda msg: None)
    assert str(listing.value) == (f"endpoint b: GET {broken.url}/v1/models failed (HTTP 500 Internal Server Error); "
                                  "is it running, and is --url its OpenAI API base?")
    assert str(warm_up.value).startswith(f"endpoint b ({broken.url}/v1, model m): the warm-up request was not "
                                         "answered: InternalServerError: Error code: 500")
    assert "engine down" in str(warm_up.value) and "\n" not in str(warm_up.value)
    nothing = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(UsageError, match=r"^endpoint gone: GET \S+/v1/models failed \(.*Connection refused"):
        run_endpoints(parse_endpoints([f"gone={nothing}"]), load, log=lambda msg: None)


@pytest.mark.system
def test_a_bare_openai_endpoint_is_timed_from_its_first_content(tmp_path):
    log = []
    with serving(OpenAIEndpoint("a", log, words=5), OpenAIEndpoint("b", log, words=3)) as (a, b):
        load = Load(_prompts(2), ("greedy", "sample"), (2,), lambda task: 16, repeats=2)
        records, notes = run_endpoints(parse_endpoints([f"a={a.url}", f"b={b.url}"]), load, log=lambda msg: None)
    assert notes == []
    assert all(r.timing.outcome == "answered" for r in records)
    # Chat tasks on the chat route, raw prompts on the completions route; the model /v1/models named.
    routes = {(name, path, "messages" in body, body["model"]) for name, path, body in log}
    assert routes == {("a", "/v1/chat/completions", True, "a-model"), ("a", "/v1/completions", False, "a-model"),
                      ("b", "/v1/chat/completions", True, "b-model"), ("b", "/v1/completions", False, "b-model")}
    # The role-only chunk is not the first text; the count is usage's.
    assert all(r.timing.first_text >= FIRST_TEXT_DELAY for r in records)
    assert {r.mode: r.timing.completion_tokens for r in records} == {"a": 5, "b": 3}
    assert {r.timing.text for r in records if r.mode == "b"} == {" w0 w1 w2"}
    assert all(r.timing.drafted == 0 for r in records)  # it reports no drafts, and nothing needs them
    assert len(records) == 2 * 2 * 2 * 2 * 2  # endpoints x tasks x settings x repeats x prompts


@pytest.mark.system
def test_bench_serve_url_against_our_server_and_a_bare_endpoint_writes_the_spread(tmp_path, capsys):
    prompts = tmp_path / "mine.jsonl"
    prompts.write_text('{"prompt": "the cat sat", "kind": "short"}\n{"prompt": "a dog ran far away"}\n')
    app, _ = toy_app(eos=False, parallel=2)
    with running(app) as ours, serving(OpenAIEndpoint("bare", [], words=6)) as (bare,):
        code = main(["bench", "serve", "--url", f"ours={ours}/v1", "--url", bare.url, "--prompts-file", str(prompts),
                     "--settings", "greedy", "--clients", "1,2", "--max-new-tokens", "6", "--out", str(tmp_path / "out"),
                     "--baseline", bare.url.removeprefix("http://")])
    assert code == 0
    report = (tmp_path / "out" / "serve.md").read_text()
    assert report.startswith("# specsample bench serve\n")
    header, _, *rows = report.split("## Serving load")[1].split("\n\n")[2].splitlines()
    columns = [c.strip() for c in header.split("|")]
    assert f"tokens/s ÷ {bare.url.removeprefix('http://')}" in columns
    ours_rows = [dict(zip(columns, [c.strip() for c in row.split("|")])) for row in rows if "| ours |" in row]
    assert [row["clients"] for row in ours_rows] == ["1", "2"]
    for row in ours_rows:
        assert row["repeats"] == "3" and row["answered"] == "6/6" and row["slots"] == "–"
        assert " (" in row["tokens/s"] and "–" in row["tokens/s"]  # median (min–max) of three repeats
        assert float(row["acceptance"]) >= 0  # our server reports its drafts; the bare endpoint does not
    served = [ServedRecord.from_json(json.loads(line)) for line in (tmp_path / "out" / "serve.jsonl").open()]
    assert {r.repeat for r in served} == {0, 1, 2} and {r.mode for r in served} == {"ours", bare.url[7:]}
    assert "| ours |" in capsys.readouterr().out
