"""The one-model queue: full gives 429 at once, waiting too long gives a timeout error,
and a client that leaves mid-generation frees the model at the next round."""

import contextlib
import threading
import time

import httpx
import pytest

from serve_helpers import running, toy_app, wait_until

pytestmark = pytest.mark.system

BODY = {"model": "toy", "prompt": "the cat", "max_tokens": 4, "seed": 0}


def post_in_background(url, results, body=BODY):
    def go():
        results.append(httpx.post(url + "/v1/completions", json=body, timeout=30).status_code)

    t = threading.Thread(target=go)
    t.start()
    return t


@contextlib.contextmanager
def worker_held(**settings):
    """A served toy whose worker is busy with a first request, held at the target's
    gate until the test opens it. Yields the app, the target, the URL, the list the
    background requests' statuses go to, and the first request's thread."""
    app, target = toy_app(**settings)
    worker = app.state.server.worker
    with running(app) as url:
        target.gate.clear()
        results = []
        first = post_in_background(url, results)
        wait_until(lambda: worker.active, what="the worker to start")
        yield app, target, url, results, first


def test_full_queue_answers_429_at_once_and_the_rest_complete():
    with worker_held(max_queue=2) as (app, target, url, results, first):
        worker = app.state.server.worker
        threads = [first] + [post_in_background(url, results) for _ in range(2)]
        wait_until(lambda: worker.depth == 2, what="two waiting requests")
        r = httpx.post(url + "/v1/completions", json=BODY, timeout=30)
        assert r.status_code == 429 and r.json()["error"]["code"] == "queue_full"
        # At once, not after the queue drains: the gate is still shut, so nothing has.
        assert worker.depth == 2 and results == []
        target.gate.set()
        for t in threads:
            t.join(timeout=30)
        assert results == [200, 200, 200]


def test_waiting_too_long_gets_a_timeout_error_and_the_worker_goes_on():
    with worker_held(queue_timeout=0.5) as (app, target, url, results, first):
        r = httpx.post(url + "/v1/completions", json=BODY, timeout=30)
        assert r.status_code == 503 and r.json()["error"]["code"] == "queue_timeout"
        target.gate.set()
        first.join(timeout=30)
        assert results == [200]
        assert httpx.post(url + "/v1/completions", json=BODY, timeout=30).status_code == 200


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_leaving_mid_generation_frees_the_model(stream):
    app, target = toy_app(eos=False, policy=2, context_length=4096)  # the draft's context is checked too
    target.delay = 0.01  # 1,000 tokens take 334+ rounds (k = 2) if nobody stops them
    long = {**BODY, "max_tokens": 1000, "stream": stream}
    with running(app) as url:
        if stream:
            with httpx.stream("POST", url + "/v1/completions", json=long, timeout=30) as r:
                assert next(line for line in r.iter_lines() if line.startswith("data: {"))
        else:
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(url + "/v1/completions", json=long, timeout=0.5)
        r = httpx.post(url + "/v1/completions", json=BODY, timeout=30)
        assert r.status_code == 200
        wait_until(lambda: "specsample_cancelled_generations_total 1.0" in httpx.get(url + "/metrics").text,
                   what="the cancellation to be counted")
        # Freed by the cancellation, not by the long answer ending: counted in the
        # target's calls, not in seconds, so a slow machine cannot make it pass or fail.
        assert target.calls < 334


def test_requests_that_gave_up_waiting_hold_no_place_in_the_queue():
    """Timed-out requests stay in the queue until the worker reaches them; they must
    not count against --max-queue, or a busy minute turns every newcomer away."""
    with worker_held(max_queue=1, queue_timeout=0.3) as (app, target, url, results, first):
        worker = app.state.server.worker
        for _ in range(2):  # each waits 0.3 s, gives up, and leaves its job behind
            assert httpx.post(url + "/v1/completions", json=BODY, timeout=30).status_code == 503
        assert worker.depth == 0
        app.state.server.settings.queue_timeout = 30  # the newcomer waits for its turn
        late = post_in_background(url, results, {**BODY, "seed": 1})
        wait_until(lambda: worker.depth == 1, what="the newcomer to wait")
        target.gate.set()
        for t in (first, late):
            t.join(timeout=30)
        assert sorted(results) == [200, 200]


def test_erasing_the_slot_a_request_is_generated_on_answers_409_and_the_request_completes():
    with worker_held() as (app, target, url, results, first):
        erased = []
        eraser = threading.Thread(target=lambda: erased.append(httpx.post(url + "/slots/0?action=erase", json={}, timeout=30)))
        eraser.start()
        # asked while the first request's call is held: done after that call, mid-generation
        wait_until(lambda: app.state.server.worker._erasing, what="the erase to be asked")
        target.gate.set()
        eraser.join(timeout=30)
        first.join(timeout=30)
        assert erased[0].status_code == 409 and erased[0].json()["error"]["param"] == "id_slot", erased[0].text
        assert results == [200]
        assert httpx.post(url + "/slots/0?action=erase", json={}, timeout=30).status_code == 200  # free again


def test_an_erase_waiting_when_the_target_is_lost_hears_it():
    from specsample.serve.worker import TargetLost

    with worker_held() as (app, target, url, results, first):
        worker = app.state.server.worker
        done = worker.erase(0)
        worker.lose(TargetLost("the RPC worker is gone"))
        with pytest.raises(TargetLost):
            done.result(timeout=5)
        target.gate.set()
        first.join(timeout=30)


def test_erases_and_requests_asked_while_the_server_stops_hear_so():
    """stop() ends the worker's thread: an erase it never comes to, and any erase or
    request asked afterwards, fail with ShuttingDown (a 503) rather than wait for good."""
    from specsample.serve.worker import QueuedRequest, ShuttingDown

    with worker_held() as (app, target, url, results, first):
        worker = app.state.server.worker
        pending = worker.erase(0)
        worker.stop(timeout=0.1)  # the first request's call is held: the thread cannot end yet
        with pytest.raises(ShuttingDown):
            pending.result(timeout=5)
        with pytest.raises(ShuttingDown):
            worker.erase(0)
        with pytest.raises(ShuttingDown):
            worker.submit(QueuedRequest([], lambda draft: None, None))
        r = httpx.post(url + "/slots/0?action=erase", json={}, timeout=30)
        assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down", r.text
        r = httpx.post(url + "/v1/completions", json=BODY, timeout=30)
        assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down", r.text
        target.gate.set()
        first.join(timeout=30)


def test_an_erase_whose_asker_left_does_not_stop_the_worker():
    """A client that leaves while its erase waits cancels the future; the worker then
    settles it without raising in its own thread, and serves the next request."""
    with worker_held() as (app, target, url, results, first):
        worker = app.state.server.worker
        done = worker.erase(0)
        assert done.cancel()
        target.gate.set()
        first.join(timeout=30)
        assert results == [200]
        assert httpx.post(url + "/v1/completions", json=BODY, timeout=10).status_code == 200
        assert worker._thread.is_alive()


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_leaving_during_its_long_prompt_stops_its_prompt_chunks(stream):
    """A 1,651-token prompt whose client left after 1 s was scored chunk by chunk for
    minutes: the worker only looked between rounds. Here 1,500 tokens in chunks of 8,
    0.05 s each (about 10 s): the chunks stop within a call or two of the leaving."""
    app, target = toy_app(drafter="none", parallel=2, context_length=4096)
    app.state.server.worker.scheduler.prefill_chunk = 8
    calls = []
    score_many = target.score_many
    target.score_many = lambda requests: calls.append(len(requests)) or score_many(requests)
    target.delay = 0.05
    long = {**BODY, "prompt": " ".join(["the cat sat on a mat"] * 250), "max_tokens": 4, "stream": stream}
    with running(app) as url:
        with pytest.raises(httpx.ReadTimeout):
            if stream:
                with httpx.stream("POST", url + "/v1/completions", json=long, timeout=0.7) as r:
                    list(r.iter_lines())
            else:
                httpx.post(url + "/v1/completions", json=long, timeout=0.7)
        wait_until(lambda: "specsample_cancelled_generations_total 1.0" in httpx.get(url + "/metrics").text,
                   what="the cancellation to be counted", timeout=5)
        scored = len(calls)
        time.sleep(0.5)
        assert len(calls) == scored < 40  # of the 188 chunks; none after the cancellation
