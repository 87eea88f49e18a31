"""Every phase of a connection ends by a deadline (docs/serve.md, "Security"): a client
holds no place under --max-connections for longer than the deadline of the phase it
stalls in, and what it stalls costs one INFO line, a 499 in the metrics, never an ERROR."""

import contextlib
import json
import logging
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from specsample.serve import connections

from serve_helpers import running, toy_app, wait_until
from test_serve_security import ServerLog, metric, server_log  # noqa: F401 (a fixture)

pytestmark = pytest.mark.system

PLACES = 4  # --max-connections in these tests


@contextlib.contextmanager
def guarded(app, places=PLACES, send_timeout=30.0):
    """The app served as `serve` serves it (connections.protocol), with short deadlines."""
    with running(app, sndbuf=4096, limit_concurrency=places, timeout_keep_alive=0.5,
                 http=connections.protocol(0.5, send_timeout)) as url:
        yield url


def connect(url: str, rcvbuf: int | None = None) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:  # before connecting, so that the window stays this small
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(10)
    sock.connect((host, int(port)))
    return sock


def answer_status(sock: socket.socket) -> int:
    """The status line of the answer (its first bytes suffice: these are small)."""
    return int(sock.recv(4096).split(b" ", 2)[1])


class Trickle:
    """A byte now and then on each socket until stopped: clients that keep sending
    what nobody will read."""

    def __init__(self, socks):
        self.socks, self.stop = socks, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop.wait(0.1):
            for s in self.socks:
                with contextlib.suppress(OSError):
                    s.send(b"x")

    def close(self):
        self.stop.set()
        self.thread.join()
        for s in self.socks:
            s.close()


def health_turns_200(url: str, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return True
        time.sleep(0.1)
    return False


HEADERS = b"Host: localhost\r\nContent-Length: 100000\r\n"
# (settings, request head, status): answered before the declared body was read
ANSWERED_EARLY = {
    "health": ({}, b"GET /health HTTP/1.1\r\n" + HEADERS, 200),
    "401": ({"api_key": "k"}, b"POST /v1/completions HTTP/1.1\r\nContent-Type: application/json\r\n" + HEADERS, 401),
    "413": ({"max_body_bytes": 1000}, b"POST /v1/completions HTTP/1.1\r\nContent-Type: application/json\r\n" + HEADERS,
            413),
    "415": ({}, b"POST /v1/completions HTTP/1.1\r\nContent-Type: text/plain\r\n" + HEADERS, 415),
    "408": ({"body_timeout": 0.3}, b"POST /v1/completions HTTP/1.1\r\nContent-Type: application/json\r\n" + HEADERS,
            408),
}


@pytest.mark.parametrize("case", ANSWERED_EARLY)
def test_an_answered_request_whose_body_keeps_trickling_is_closed(case):
    """Issue 55, 1: once a request was answered before its declared body arrived, the
    header deadline and the keep-alive timer stood down, and one byte more kept the
    socket open for good: --max-connections of them turned everyone away with 503s."""
    settings, head, status = ANSWERED_EARLY[case]
    app, _ = toy_app(drafter="none", **settings)
    with guarded(app) as url:
        socks = [connect(url) for _ in range(PLACES - 1)]
        for s in socks:
            s.sendall(head + b"\r\n{")
        assert [answer_status(s) for s in socks] == [status] * len(socks)
        trickle = Trickle(socks)
        try:
            assert health_turns_200(url, within=5), "the answered sockets still hold their places"
        finally:
            trickle.close()


def test_the_client_reads_an_early_answer_whole_while_it_sends_its_body():
    """The connection is not reused after such an answer, but it is not cut either: a
    client that sends its whole body first (as httpx does) still reads its 413."""
    app, _ = toy_app(drafter="none", max_body_bytes=1000)
    with guarded(app) as url:
        answer = httpx.post(url + "/v1/completions", content=b"{" + b" " * 200_000 + b"}",
                            headers={"content-type": "application/json"}, timeout=10)
        assert answer.status_code == 413 and answer.json()["error"]["code"] == "body_too_large"
        assert httpx.get(url + "/health", timeout=5).status_code == 200


STREAM = {"model": "toy", "prompt": "the cat", "max_tokens": 200, "n": 4, "logprobs": 5, "stream": True,
          "seed": 0}


def test_a_stream_dropped_for_not_reading_frees_its_place_with_one_info_line(server_log):
    """Issue 55, 2 and 10: uvicorn waited for ever to flush what a client that stopped
    reading had not taken, so its place under --max-connections was never freed; the
    drop logged an ERROR, and the metrics counted it a 200."""
    app, _ = toy_app(drafter="none", eos=False, context_length=512)
    with guarded(app, places=2, send_timeout=0.5) as url:
        server_log.listen()
        sock = connect(url, rcvbuf=4096)
        body = json.dumps(STREAM).encode()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        try:
            wait_until(lambda: any("stopped reading" in r.getMessage() for r in server_log), what="the drop")
            assert health_turns_200(url, within=5), "the dropped stream still holds its place"
            counted = 'specsample_requests_total{endpoint="/v1/completions",status="%s"}'
            wait_until(lambda: metric(url, counted % 499) == 1, what="the drop counted as 499")
            assert metric(url, counted % 200) == 0
        finally:
            sock.close()
    dropped = [r for r in server_log if "stopped reading" in r.getMessage()]
    assert len(dropped) == 1 and dropped[0].levelno == logging.INFO
    # uvicorn's "Exceeded concurrency limit" for a probe that came before the place was freed is no fault
    faults = [r for r in server_log if r.levelno >= logging.WARNING and "concurrency" not in r.getMessage()]
    assert not faults, [r.getMessage() for r in server_log]


def test_a_large_answer_never_read_is_dropped_after_the_send_timeout():
    """Not only streams: a whole answer the client does not take holds no place past
    the send timeout either (its close would wait to flush for ever)."""
    app, _ = toy_app(drafter="none", eos=False, context_length=512)
    with guarded(app, places=2, send_timeout=0.5) as url:
        sock = connect(url, rcvbuf=4096)
        body = json.dumps({**STREAM, "stream": False}).encode()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                     b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        try:
            assert health_turns_200(url, within=8), "the unread answer still holds its place"
        finally:
            sock.close()


def test_a_stream_whose_client_leaves_counts_as_499():
    """Issue 55, 10: a cancelled stream was counted with the 200 it began with."""
    app, _ = toy_app(drafter="none", eos=False, context_length=512)
    with running(app) as url:
        with httpx.stream("POST", url + "/v1/completions", json={**STREAM, "n": 1, "logprobs": None},
                          timeout=10) as r:
            next(r.iter_lines())
        counted = 'specsample_requests_total{endpoint="/v1/completions",status="%s"}'
        wait_until(lambda: metric(url, counted % 499) == 1, what="the cancelled stream counted as 499")
        assert metric(url, counted % 200) == 0


def test_shutting_down_ends_whole_requests_with_503_and_streams_with_an_error_then_done(monkeypatch):
    """Issue 55, 9: on SIGTERM uvicorn cancelled what was still running once its grace
    ran out, a 500 with a CancelledError traceback, and sse-starlette cut streams at
    once, with no error event and no [DONE]."""
    from sse_starlette.sse import AppStatus

    app, target = toy_app(drafter="none", eos=False, context_length=512, parallel=2)
    target.delay = 0.02  # 200 tokens take 4 s: both requests are in flight at the shutdown
    worker = app.state.server.worker
    request = {"model": "toy", "prompt": "the cat", "max_tokens": 200}
    with httpx.Client(timeout=20) as client, ThreadPoolExecutor(1) as pool, contextlib.ExitStack() as streams:
        with running(app, timeout_graceful_shutdown=2.3, http=connections.protocol(0.5, 30, shutdown_grace=0.3)) as url:
            stream = streams.enter_context(client.stream("POST", url + "/v1/completions", json={**request, "stream": True}))
            lines = stream.iter_lines()
            assert next(lines).startswith("data: ")
            whole = pool.submit(client.post, url + "/v1/completions", json=request)
            wait_until(lambda: worker.active == 2, what="both requests generating")
            monkeypatch.setattr(AppStatus, "should_exit", True)  # what SIGTERM sets (sse-starlette's hook)
        # leaving `running` shut the server down, once the requests in flight ended
        rest = [line for line in lines if line.startswith("data: ")]
        answer = whole.result()
    assert answer.status_code == 503 and answer.json()["error"]["code"] == "shutting_down", answer.text
    assert rest[-1] == "data: [DONE]"
    assert json.loads(rest[-2].removeprefix("data: "))["error"]["code"] == "shutting_down"
