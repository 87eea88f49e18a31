"""Slots: several requests generated at once (serve --parallel), through the official
`openai` client. A seeded answer is the text the library gives for the request alone,
whatever shares its calls; overload is answered, never lost; a client that leaves
frees its slot while the others go on; stopping the worker ends every request."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from openai import APIStatusError, OpenAI

from specsample.decoding.drafters import ModelDrafter
from specsample.decoding.generate import GenerationConfig, generate
from specsample.decoding.sampling import SamplingConfig
from specsample.serve.events import End, Ended
from specsample.serve.worker import QueuedRequest, ChoiceTask, ShuttingDown, Worker

from serve_helpers import ToySequences, WordTokenizer, running, toy_app, toy_pair, wait_until

pytestmark = pytest.mark.system

PROMPTS = ["the cat sat on a mat", "a dog ran far away", "the big red dog", "it was over here and then"]


def alone(prompt: str, seed: int, max_tokens: int, temperature: float):
    target, draft = toy_pair()
    sampling = SamplingConfig(temperature)
    config = GenerationConfig(max_new_tokens=max_tokens, sampling=sampling, seed=seed)
    return generate(target, WordTokenizer().encode(prompt), config, ModelDrafter(draft, sampling), 3).text


def batch_histogram(url: str) -> tuple[float, float]:
    """(target calls serving one request, all target calls) from /metrics."""
    lines = httpx.get(url + "/metrics").text.splitlines()
    one = next(line for line in lines if line.startswith('specsample_batch_sequences_bucket{le="1.0"}'))
    total = next(line for line in lines if line.startswith("specsample_batch_sequences_count"))
    return float(one.split()[-1]), float(total.split()[-1])


def test_concurrent_seeded_requests_get_the_text_they_get_alone_and_share_calls():
    app, target = toy_app(parallel=4, max_queue=64)
    target.delay = 0.005  # calls last long enough for requests to overlap
    requests = [(PROMPTS[i % 4], i, 8 + 3 * (i % 3), [1.0, 0.7, 0.0][i % 3]) for i in range(12)]
    with running(app) as url:
        client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)

        def ask(request):
            prompt, seed, max_tokens, temperature = request
            return client.completions.create(model="toy", prompt=prompt, max_tokens=max_tokens, seed=seed,
                                             temperature=temperature).choices[0].text

        with ThreadPoolExecutor(4) as pool:
            texts = list(pool.map(ask, requests))
        assert texts == [alone(*request) for request in requests]
        one, total = batch_histogram(url)
        assert total > one  # some target calls served several requests
        assert 'specsample_slots 4.0' in httpx.get(url + "/metrics").text


def test_eight_clients_on_two_slots_are_answered_or_refused_none_lost():
    app, target = toy_app(parallel=2, max_queue=2, eos=False, context_length=4096)
    statuses = []
    with running(app) as url:
        client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)
        worker = app.state.server.worker

        def ask(i):
            try:
                client.completions.create(model="toy", prompt=PROMPTS[i % 4], max_tokens=40, seed=i)
                statuses.append(200)
            except APIStatusError as e:
                statuses.append(e.status_code)

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
        target.delay = 0.05
        for t in threads[:2]:
            t.start()
        wait_until(lambda: worker.active == 2, what="both slots to be taken")
        target.gate.clear()  # hold them there while the others come
        for t in threads[2:]:
            t.start()
        wait_until(lambda: len(statuses) == 4, what="the four requests beyond two slots and two places")
        assert statuses == [429] * 4 and worker.active == 2 and worker.depth == 2
        target.gate.set()
        for t in threads:
            t.join(timeout=30)
    assert sorted(statuses) == [200] * 4 + [429] * 4


def test_a_client_leaving_frees_its_slot_and_the_others_finish_unchanged():
    app, target = toy_app(parallel=2, eos=False, context_length=4096, max_queue=8)
    target.delay = 0.005
    with running(app) as url:
        body = {"model": "toy", "prompt": PROMPTS[0], "max_tokens": 1000, "stream": True, "seed": 0}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as r:
            assert next(line for line in r.iter_lines() if line.startswith("data: {"))
        # The long one is gone; two short ones are served, in the slot it left too.
        with ThreadPoolExecutor(2) as pool:
            texts = list(pool.map(lambda i: httpx.post(url + "/v1/completions", timeout=30, json={
                "model": "toy", "prompt": PROMPTS[i], "max_tokens": 8, "seed": i}).json()["choices"][0]["text"],
                [1, 2]))
        assert texts == [alone(PROMPTS[i], i, 8, 1.0) for i in (1, 2)]
        wait_until(lambda: "specsample_cancelled_generations_total 1.0" in httpx.get(url + "/metrics").text,
                   what="the cancellation to be counted")
        wait_until(lambda: app.state.server.worker.active == 0, what="every slot to be free")


class Inline:
    """Stands in for a request's event loop: events are queued at once."""

    def call_soon_threadsafe(self, callback, *args):
        callback(*args)


def test_stopping_the_worker_ends_every_request_generating_or_waiting():
    """Two generations share the batch and a third waits; stop() cancels them all: each
    hears one Ended with ShuttingDown (a 503), and the worker's thread ends (no request is left asleep
    in a sequence of the scheduler)."""
    target = ToySequences(0, sequences=2, eos=False, context_length=4096)
    target.delay = 0.01
    worker = Worker(target, max_queue=4, parallel=2)
    worker.start()
    config = GenerationConfig(max_new_tokens=2000)
    jobs = [QueuedRequest([ChoiceTask(0, [5, 6, 7], config)], lambda draft: None, Inline()) for _ in range(3)]
    for job in jobs:
        worker.submit(job)
    deadline = time.monotonic() + 20
    while worker.active < 2 or worker.scheduler.stats.target_calls < 4:
        assert time.monotonic() < deadline, "the generations never started"
        time.sleep(0.01)
    worker.stop()
    assert not worker._thread.is_alive()
    for job in jobs:
        events = []
        while not job.events.empty():
            events.append(job.events.get_nowait())
        [ended] = [e for e in events if isinstance(e, Ended)]
        assert ended.end is End.FAILED and isinstance(ended.error, ShuttingDown)
    assert worker.active == 0 and worker.scheduler.live == 0


def test_a_requests_n_choices_are_spread_over_the_free_slots():
    """They took turns on one slot while three others idled: n = 6 on four free slots now
    shares target calls (four choices at once, then the last two), and each choice is
    still the library's answer for its seed (seed + i)."""
    app, target = toy_app(parallel=4)
    calls = []
    score_many = target.score_many
    target.score_many = lambda requests: calls.append(len(requests)) or score_many(requests)
    with running(app) as url:
        r = httpx.post(url + "/v1/completions", json={"model": "toy", "prompt": PROMPTS[0], "max_tokens": 6,
                                                      "seed": 5, "n": 6, "temperature": 1.0}, timeout=30)
        assert r.status_code == 200, r.text
        texts = [c["text"] for c in sorted(r.json()["choices"], key=lambda c: c["index"])]
        assert texts == [alone(PROMPTS[0], 5 + i, 6, 1.0) for i in range(6)]
        assert max(calls) == 4
        streamed = httpx.post(url + "/v1/completions", json={"model": "toy", "prompt": PROMPTS[1], "max_tokens": 4,
                                                             "seed": 1, "n": 3, "stream": True}, timeout=30)
        finished = [line for line in streamed.text.splitlines() if '"finish_reason": "' in line]
        assert len(finished) == 3 and streamed.text.rstrip().endswith("[DONE]")
