"""A target lost mid-call (an RPC worker died: rpc.guard_aborts parks the call's thread
and tells the worker): every request, running, waiting or new, gets a 503 that says
so, and /health turns 503, while the server itself keeps answering."""

import json
import os
import socket
import threading

import httpx
import pytest

from serve_helpers import running, toy_app, wait_until
from specsample.serve.worker import TargetLost

pytestmark = pytest.mark.system

BODY = {"model": "toy", "prompt": "the cat", "max_tokens": 40, "seed": 0}
LINE = "a llama.cpp RPC worker stopped answering in the middle of a call (test)"


def test_a_lost_target_answers_every_request_with_a_503_naming_it_and_health_says_so():
    app, target = toy_app(drafter="none", api_key="sk-test", max_queue=4)
    worker = app.state.server.worker
    auth = {"Authorization": "Bearer sk-test"}
    parked = threading.Event()  # the lost call's thread, parked as rpc.guard_aborts parks it
    calls = {"n": 0}
    score = target.score

    def score_then_lose(token_ids, num_logits):
        calls["n"] += 1
        if calls["n"] == 4:  # mid-generation: the prefill and two rounds went through
            worker.lose(TargetLost(LINE))
            parked.wait(30)
            raise RuntimeError("unparked at the end of the test")
        return score(token_ids, num_logits)

    target.score = score_then_lose
    with running(app) as url:
        assert httpx.get(url + "/health").status_code == 200
        streamed, waiting = [], []

        def stream():
            with httpx.stream("POST", url + "/v1/completions", json={**BODY, "stream": True}, headers=auth,
                              timeout=30) as r:
                streamed.extend(line for line in r.iter_lines() if line.startswith("data: "))

        def wait_in_queue():
            waiting.append(httpx.post(url + "/v1/completions", json=BODY, headers=auth, timeout=30))

        first = threading.Thread(target=stream)
        target.gate.clear()  # hold the first call until the second request waits behind it
        first.start()
        wait_until(lambda: worker.active, what="the first request to start")
        second = threading.Thread(target=wait_in_queue)
        second.start()
        wait_until(lambda: worker.depth == 1, what="the second request to wait")
        target.gate.set()
        first.join(30)
        second.join(30)
        try:
            # The request being generated: its text so far, then the error, then [DONE].
            *text, error, done = streamed
            assert text and done == "data: [DONE]"
            assert json.loads(error[6:])["error"]["code"] == "target_unavailable"
            assert LINE in json.loads(error[6:])["error"]["message"]
            # The one waiting behind it, a new one, and /health: 503 naming it.
            for r in (waiting[0], httpx.post(url + "/v1/completions", json=BODY, headers=auth, timeout=30),
                      httpx.post(url + "/v1/chat/completions", headers=auth, timeout=30,
                                 json={"model": "toy", "messages": [{"role": "user", "content": "the"}]}),
                      httpx.get(url + "/health")):
                assert r.status_code == 503, r.text
                assert r.json()["error"]["code"] == "target_unavailable" and LINE in r.json()["error"]["message"]
            # The doors still hold: no key, no answer (only /health is open).
            assert httpx.post(url + "/v1/completions", json=BODY, timeout=30).status_code == 401
            assert httpx.get(url + "/v1/models", headers=auth).status_code == 200  # the rest still answers
        finally:
            parked.set()


def test_the_reload_keeps_the_listening_socket_for_the_process_that_replaces_this_one(monkeypatch):
    """What a reload hands over: the listening socket by descriptor number, inheritable
    across exec, and nothing else of ours (recovery._reload, up to the exec itself)."""
    from specsample.backends import rpc
    from specsample.serve import recovery

    listener = socket.create_server(("127.0.0.1", 0))
    execs, released = [], []
    monkeypatch.setattr(rpc, "release", lambda workers: released.append(workers))
    monkeypatch.setattr(rpc, "probe", lambda endpoint, timeout: (2, 0, 0))
    monkeypatch.setattr(recovery.os, "closerange", lambda low, high: execs.append(("closed", low, high)))
    monkeypatch.setattr(recovery.os, "execve", lambda path, argv, env: execs.append((path, argv, env)))
    workers = rpc.parse_workers("127.0.0.1:1,127.0.0.1:2")
    try:
        recovery._reload(workers, listener, ["/bin/python", "-m", "specsample", "serve"], poll=0.01)
        fd = listener.fileno()
        assert released == [workers]
        assert os.get_inheritable(fd)
        assert ("closed", 3, fd) in execs and any(e[0] == "closed" and e[1] == fd + 1 for e in execs)
        path, argv, env = execs[-1]
        assert argv == ["/bin/python", "-m", "specsample", "serve"] and env[recovery.LISTENER_FD] == str(fd)
        # The process started afresh finds it, once.
        monkeypatch.setenv(recovery.LISTENER_FD, str(fd))
        inherited = recovery.inherited_listener()
        assert inherited.getsockname() == listener.getsockname() and not inherited.get_inheritable()
        assert recovery.inherited_listener() is None
        inherited.detach()  # the same descriptor as listener: closed once, below
    finally:
        listener.close()
