"""The server's doors (docs/serve.md, "Security"): no empty key, JSON content types
only, loopback Host names on a loopback bind, one well-formed Authorization header,
bounded body reads and stream sends, clients that leave logged in one line, and
tokenizing outside the queue in a bounded number of threads."""

import json
import logging
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import uvicorn

from specsample.cli import main
from specsample.serve import connections
from specsample.serve.settings import Settings

from serve_helpers import WordTokenizer, running, toy_app, wait_until

pytestmark = pytest.mark.system

GOOD = {"model": "toy", "prompt": "the cat", "max_tokens": 4, "seed": 0}
JSON = b'{"model": "toy", "prompt": "the cat", "max_tokens": 4, "seed": 0}'


@pytest.fixture(scope="module")
def url():
    app, _ = toy_app()
    with running(app) as base:
        yield base


class ServerLog(list):
    """What the server logs on uvicorn's logger (which does not reach caplog), from
    listen() on: starting uvicorn resets that logger's handlers and level."""

    logger = logging.getLogger("uvicorn.error")

    def listen(self):
        self.handler = logging.Handler()
        self.handler.emit = self.append
        self.logger.addHandler(self.handler)
        self.logger.setLevel(logging.INFO)


@pytest.fixture
def server_log():
    log = ServerLog()
    level = log.logger.level
    yield log
    log.logger.removeHandler(getattr(log, "handler", None))
    log.logger.setLevel(level)


# ---- 4: an empty key is refused, never "no key" ------------------------------------

@pytest.mark.parametrize("key,env", [("", None), ("   ", None), (None, ""), (None, " \t")])
def test_an_empty_api_key_is_refused_at_start_in_one_line(capsys, monkeypatch, key, env):
    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: pytest.fail("must not start"))
    if env is not None:
        monkeypatch.setenv("SPECSAMPLE_API_KEY", env)
    args = ["serve", "--draft", "ngram", "--target", "no-such-model"] + (["--api-key", key] if key is not None else [])
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "API key is empty" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("key", ["", "  "])
def test_the_library_refuses_an_empty_key_too(key):
    with pytest.raises(ValueError, match="API key is empty"):
        toy_app(api_key=key)


# ---- 6: cross-site requests and DNS rebinding ---------------------------------------

@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x", "application/jsonp"])
def test_a_json_route_refuses_a_body_that_is_not_declared_json(url, content_type):
    headers = {"content-type": content_type} if content_type else {}
    for path, body in (("/v1/completions", JSON), ("/v1/chat/completions", b'{"model": "toy", "messages": []}'),
                       ("/tokenize", b'{"prompt": "the cat"}'), ("/detokenize", b'{"tokens": [5]}')):
        r = httpx.post(url + path, content=body, headers=headers, timeout=10)
        assert r.status_code == 415, (path, r.text)
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["code"] == "unsupported_media_type"
        assert "application/json" in error["message"]


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
def test_erasing_a_slot_needs_a_json_content_type_too(content_type):
    """A cross-site page may POST without a preflight; on a keyless server it would
    erase the slots (and learn from the answer what they held)."""
    app, _ = toy_app(drafter="none")
    with running(app) as url:
        headers = {"content-type": content_type} if content_type else {}
        r = httpx.post(url + "/slots/0?action=erase", content=b"", headers=headers, timeout=10)
        assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type", r.text
        assert httpx.post(url + "/slots/0?action=erase", json={}, timeout=10).status_code == 200


def test_a_number_too_large_for_a_double_is_a_400_that_says_so(url):
    schema = {"type": "object", "properties": {"x": {"type": "number", "maximum": 1}}}
    body = json.dumps({**GOOD, "response_format": {"type": "json_schema", "json_schema": {
        "name": "s", "schema": schema}}}).replace('"maximum": 1', '"maximum": 1e999')
    r = httpx.post(url + "/v1/completions", content=body, headers={"content-type": "application/json"}, timeout=10)
    assert r.status_code == 400 and "1e999 is out of range" in r.json()["error"]["message"], r.text


@pytest.mark.parametrize("content_type", ["application/json", "Application/JSON", "application/json; charset=utf-8",
                                          "application/json;charset=UTF-8"])
def test_json_with_parameters_in_any_case_is_accepted(url, content_type):
    r = httpx.post(url + "/v1/completions", content=JSON, headers={"content-type": content_type}, timeout=10)
    assert r.status_code == 200, r.text


def test_a_loopback_server_answers_loopback_host_names_only(url):
    port = url.rsplit(":", 1)[1]
    for host in ("localhost", f"localhost:{port}", f"127.0.0.1:{port}", "127.1.2.3", f"[::1]:{port}", "LOCALHOST"):
        for method, path in (("GET", "/health"), ("GET", "/v1/models"), ("POST", "/v1/completions")):
            r = httpx.request(method, url + path, headers={"host": host}, json=GOOD, timeout=10)
            assert r.status_code == 200, (host, path, r.text)
    for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example", "localhost.evil.example",
                 "10.0.0.1", "[::2]", "[::1]evil.example", f"[::1]evil.example:{port}", "[::1]:80x", "[::1"):
        for method, path in (("GET", "/health"), ("GET", "/v1/models"), ("POST", "/v1/completions")):
            r = httpx.request(method, url + path, headers={"host": host}, json=GOOD, timeout=10)
            assert r.status_code == 421, (host, path, r.text)
            error = r.json()["error"]
            assert error["code"] == "host_not_allowed" and "--allowed-hosts" in error["message"]


def test_allowed_hosts_add_names_and_a_star_or_none_allows_any():
    app, _ = toy_app(allowed_hosts=("models.example:8000", "Other.Example"))
    with running(app) as url:
        for host, status in (("models.example", 200), ("models.example:9", 200), ("other.example", 200),
                             ("localhost", 200), ("evil.example", 421)):
            assert httpx.get(url + "/v1/models", headers={"host": host}).status_code == status, host
    for allowed in (None, ("*",)):
        app, _ = toy_app(allowed_hosts=allowed)
        with running(app) as url:
            assert httpx.get(url + "/v1/models", headers={"host": "anything.example"}).status_code == 200


def test_the_host_check_comes_before_the_key():
    app, _ = toy_app(api_key="s3cret")
    with running(app) as url:
        r = httpx.get(url + "/v1/models", headers={"host": "evil.example"})
        assert r.status_code == 421


# ---- 7: Authorization parsing -------------------------------------------------------

def test_the_bearer_scheme_in_any_case_and_exactly_one_authorization_header():
    app, _ = toy_app(api_key="s3cret")
    with running(app) as url:
        for value in ("Bearer s3cret", "bearer s3cret", "BEARER s3cret", "bEaReR  s3cret"):
            assert httpx.get(url + "/v1/models", headers={"Authorization": value}).status_code == 200, value
        for value in ("Basic s3cret", "Bearer", "Bearers3cret", "Bearer s3cret2", "Bearer S3CRET", "s3cret"):
            r = httpx.get(url + "/v1/models", headers={"Authorization": value})
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", value
        for pair in (["Bearer wrong", "Bearer s3cret"], ["Bearer s3cret", "Bearer s3cret"]):
            r = httpx.get(url + "/v1/models", headers=[("Authorization", v) for v in pair])
            assert r.status_code == 400, pair
            error = r.json()["error"]
            assert error["code"] == "invalid_authorization" and "2 Authorization headers" in error["message"]


# ---- 9: a connection's life ---------------------------------------------------------

def raw_request(url: str, body_sent: bytes, length: int) -> socket.socket:
    """A socket that sent a completion's headers and the first bytes of its body."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: " + host.encode() + b"\r\n"
                 b"Content-Type: application/json\r\nContent-Length: " + str(length).encode() + b"\r\n\r\n" + body_sent)
    return sock


def test_a_body_that_trickles_past_the_deadline_gets_a_408():
    app, _ = toy_app(body_timeout=0.5)
    with running(app) as url:
        sock = raw_request(url, JSON[:10], len(JSON))
        start = time.monotonic()
        with sock:
            for b in JSON[10:20]:  # a byte now and then: each read is quick, the whole is not
                time.sleep(0.1)
                sock.sendall(bytes([b]))
            answer = sock.recv(4096)
        assert answer.startswith(b"HTTP/1.1 408") and b"request_timeout" in answer
        assert time.monotonic() - start < 5
        assert httpx.post(url + "/v1/completions", json=GOOD, timeout=10).status_code == 200


def metric(url: str, line_start: str) -> float:
    lines = httpx.get(url + "/metrics").text.splitlines()
    return sum(float(line.split()[-1]) for line in lines if line.startswith(line_start))


def test_a_client_leaving_mid_body_is_one_info_line_and_no_500(server_log):
    app, _ = toy_app()
    with running(app) as url:
        server_log.listen()
        for _ in range(5):
            raw_request(url, JSON[:10], len(JSON)).close()
        counted = 'specsample_requests_total{endpoint="/v1/completions",status="499"}'
        wait_until(lambda: metric(url, counted) == 5, what="five requests counted as 499")
        assert metric(url, 'specsample_requests_total{endpoint="/v1/completions",status="500"}') == 0
        assert httpx.post(url + "/v1/completions", json=GOOD, timeout=10).status_code == 200
    left = [r for r in server_log if "left before sending all of its request body" in r.getMessage()]
    assert len(left) == 5 and all(r.levelno == logging.INFO and r.exc_info is None for r in left)
    assert not [r for r in server_log if r.levelno >= logging.WARNING], [r.getMessage() for r in server_log]


def test_connections_that_never_finish_their_headers_are_closed_and_turn_nobody_away():
    """Sockets that open and send half a request (or nothing) held their places under
    --max-connections for ever: with 4 places, 4 of them made every request a 503."""
    app, _ = toy_app(drafter="none")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, log_level="warning", limit_concurrency=4, timeout_keep_alive=5,
                            http=connections.protocol(0.5))
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_until(lambda: server.started)
    url = "http://127.0.0.1:%d" % sock.getsockname()[1]
    try:
        idle = [socket.create_connection(sock.getsockname(), timeout=5) for _ in range(4)]
        for s in idle[:2]:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Le")
        started = time.monotonic()
        assert all(s.recv(100) == b"" for s in idle)  # closed by the server
        assert time.monotonic() - started < 3
        assert httpx.post(url + "/v1/completions", json=GOOD, timeout=10).status_code == 200
        with httpx.Client(timeout=10) as client:  # a kept-alive connection still serves its next request
            assert client.get(url + "/health").status_code == 200
            assert client.get(url + "/health").status_code == 200
    finally:
        server.should_exit = True
        thread.join(10)


def test_the_serve_flags_bound_connections_and_reach_uvicorn_and_the_settings(monkeypatch):
    started = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: started.update(app=app, **kw))
    monkeypatch.setattr("specsample.serve.cli.assemble", fake_assemble)
    assert main(["serve", "--draft", "ngram"]) == 0
    settings = started["app"].state.server.settings
    assert (started["limit_concurrency"], started["timeout_keep_alive"]) == (100, 5)
    assert started["http"].header_timeout == 10 and started["timeout_graceful_shutdown"] == 3
    assert (settings.allowed_hosts, settings.body_timeout, started["http"].send_timeout) == ((), 30, 30)
    assert main(["serve", "--draft", "ngram", "--max-connections", "7", "--keep-alive-timeout", "2",
                 "--body-timeout", "3", "--send-timeout", "4", "--allowed-hosts", " a.example, b.example:80 "]) == 0
    settings = started["app"].state.server.settings
    assert (started["limit_concurrency"], started["timeout_keep_alive"], started["http"].send_timeout) == (7, 2, 4)
    assert main(["serve", "--draft", "ngram", "--header-timeout", "0.5"]) == 0 and started["http"].header_timeout == 0.5
    assert (settings.allowed_hosts, settings.body_timeout) == (("a.example", "b.example:80"), 3)
    for args, allowed in ((["--host", "0.0.0.0"], None), (["--host", "::1"], ()), (["--host", "localhost"], ()),
                          (["--host", "0.0.0.0", "--allowed-hosts", "a.example"], ("a.example",)),
                          (["--allowed-hosts", "a.example,*"], None)):
        assert main(["serve", "--draft", "ngram", *args]) == 0
        assert started["app"].state.server.settings.allowed_hosts == allowed, args


def fake_assemble(options, drafting, sequences=1):
    """The toy pair in place of loading models: these tests are about the flags."""
    from specsample.app.assemble import Models

    from serve_helpers import toy_pair

    return Models(toy_pair()[0], lookup=True)


# ---- 10: tokenizing outside the queue is bounded ------------------------------------

class CountingTokenizer(WordTokenizer):
    """Records how many threads of the pool (anyio's, which starlette's run_in_threadpool
    uses too) tokenize at once; each call takes a while, as a long prompt would. The
    worker's own decoding and nested calls (chat_messages encodes) do not count."""

    def __init__(self):
        self.lock, self.active, self.most = threading.Lock(), {}, 0

    def _counted(self, work, *args):
        me = threading.current_thread()
        if me.name != "AnyIO worker thread":
            return work(*args)
        with self.lock:
            self.active[me] = self.active.get(me, 0) + 1
            self.most = max(self.most, len(self.active))
        try:
            time.sleep(0.05)
            return work(*args)
        finally:
            with self.lock:
                self.active[me] -= 1
                if not self.active[me]:
                    del self.active[me]

    def encode(self, text):
        return self._counted(super().encode, text)

    def decode(self, token_ids):
        return self._counted(super().decode, token_ids)

    def chat_messages(self, messages, tools=None, check=None):
        return self._counted(super().chat_messages, messages, tools, check)


@pytest.mark.parametrize("threads", [1, 2])
def test_tokenizer_floods_never_take_more_than_the_tokenizer_threads(threads):
    app, target = toy_app(tokenizer_threads=threads, max_queue=64)
    target.tokenizer = tokenizer = CountingTokenizer()
    calls = [("/tokenize", {"prompt": "the cat sat"}), ("/tokenize", {"messages": [{"role": "user", "content": "a"}]}),
             ("/detokenize", {"tokens": [5, 6]}), ("/v1/completions", {**GOOD, "max_tokens": 1}),
             ("/v1/chat/completions", {"model": "toy", "messages": [{"role": "user", "content": "a"}], "max_tokens": 1})]
    with running(app) as url, ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda call: httpx.post(url + call[0], json=call[1], timeout=30), calls * 6))
    assert all(r.status_code == 200 for r in answers), [r.text for r in answers if r.status_code != 200]
    assert tokenizer.most == threads


def test_the_default_tokenizer_threads_are_one_or_two():
    assert Settings(model_name="toy").tokenizer_threads in (1, 2)
    with pytest.raises(ValueError, match="tokenizer_threads"):
        Settings(model_name="toy", tokenizer_threads=0)
