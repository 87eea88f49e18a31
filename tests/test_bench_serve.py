"""`bench --serve`: the load client against a toy server, the report, the server
processes and the command line."""

import sys
import threading

import pytest
from openai import OpenAI

from specsample.app.arguments import model_options
from specsample.bench.load import run_load, summarise_load
from specsample.bench.modes import SETTINGS
from specsample.bench.options import BENCH_CONTEXT
from benchmarks.servers import ServerProcess, ServerUnavailable, free_port
from specsample.cli import build_parser

from benchmarks.bench import parser, resolve
from benchmarks.serving import ServedMode, serve_argv, served_modes

from serve_helpers import WordTokenizer, running, toy_app, wait_until
from test_serve_queue import worker_held

pytestmark = pytest.mark.system

PROMPTS = ["the cat sat on a mat", "a dog ran far away", "the big red dog", "it was over here"]


def _body(i: int, **extra) -> dict:
    ids = WordTokenizer().encode(PROMPTS[i % len(PROMPTS)])
    return {"model": "toy", "prompt": ids, "max_tokens": 12, "temperature": 1.0, "seed": i, **extra}


def test_load_from_concurrent_clients_times_every_request_and_keeps_its_text():
    app, _ = toy_app(eos=False)
    bodies = [_body(i) for i in range(8)] + [_body(8, temperature=-1)]  # the last one is refused
    with running(app) as url:
        timings, wall = run_load(url + "/v1", bodies, concurrency=3)
        client = OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        whole = [client.completions.create(**_body(i)).choices[0].text for i in range(8)]
    assert [t.index for t in timings] == list(range(9))
    ok, refused = timings[:8], timings[8]
    assert [t.text for t in ok] == whole  # streamed text is the whole answer, each with its own seed
    assert all(t.error is None and t.completion_tokens == 12 and t.finish_reason == "length" for t in ok)
    assert all(0 < t.first_text <= t.finished <= wall for t in ok)
    assert all(t.drafted >= t.accepted and t.drafted > 0 for t in ok)  # the toy server drafts k=3
    assert refused.error is not None and "temperature" in refused.error and refused.status == 400

    summary = summarise_load(timings, wall_seconds=wall)
    assert (summary.requests, summary.answered, summary.refused, summary.lost) == (9, 8, {400: 1}, 0)
    assert (summary.completion_tokens, summary.decode_tokens) == (96, 88)  # each answer's first token is its TTFT's
    assert len(summary.ttft) == len(summary.tpot) == 8
    assert summary.tokens_per_second == pytest.approx(96 / wall)
    assert 0 < summary.decode_seconds <= wall
    assert summary.quantile("ttft", 50) <= summary.quantile("ttft", 99)


def test_a_full_queue_is_counted_as_refused_with_its_status_and_nothing_is_lost():
    with worker_held(eos=False, max_queue=1) as (app, target, url, results, first):
        waiting = threading.Thread(target=run_load, args=(url + "/v1", [_body(0)], 1))
        waiting.start()
        wait_until(lambda: app.state.server.worker.depth == 1, what="a waiting request")
        timings, wall = run_load(url + "/v1", [_body(i) for i in range(3)], concurrency=3)
        target.gate.set()
        first.join(timeout=30)
        waiting.join(timeout=30)
    assert [(t.outcome, t.status) for t in timings] == [("refused", 429)] * 3
    summary = summarise_load(timings, wall)
    assert (summary.answered, summary.refused, summary.lost, summary.completion_tokens) == (0, {429: 3}, 0, 0)


def test_a_server_that_never_answers_loses_the_request():
    timings, wall = run_load(f"http://127.0.0.1:{free_port()}/v1", [_body(0)], 1)  # nothing listens there
    assert timings[0].outcome == "lost" and timings[0].status is None and "Connection" in timings[0].error
    assert summarise_load(timings, wall).lost == 1


def test_served_modes_and_their_request_bodies():
    modes = served_modes(["ar", "spec-auto", "spec", "llamacpp-server", "llamacpp-spec"], ks=[2, 3], peer_ks=[3])
    assert [m.name for m in modes] == ["ar", "spec-auto", "spec-k2", "spec-k3", "llamacpp-server", "llamacpp-spec-k3"]
    ours = ServedMode("ar", "ar", None).request_body("m", [1, 2], 16, SETTINGS["sample"], 7, ("\ndef",))
    assert ours == {"model": "m", "prompt": [1, 2], "max_tokens": 16, "temperature": 0.8, "top_p": 0.95, "top_k": 0,
                    "min_p": 0.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0,
                    "logit_bias": {}, "stop": ["\ndef"], "seed": 7}
    native = modes[-1].request_body("m", [1, 2], 16, SETTINGS["greedy"], 7, ())
    assert native["max_tokens"] == 16 and native["speculative.n_max"] == 3 and "n_predict" not in native
    assert "stream" not in native  # the load client streams every request itself
    assert modes[-2].request_body("m", [1], 4, SETTINGS["greedy"], 0, ())["speculative.n_max"] == 0


def test_server_process_waits_for_health_and_reports_a_crash(tmp_path):
    (tmp_path / "health").write_text("{}")
    serve_dir = [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory", str(tmp_path)]
    with ServerProcess(lambda port, tmp: serve_dir + [str(port)], name="http.server") as server:
        assert server.request("/health") == {}
    assert server.process.poll() is not None  # stopped on exit

    crash = [sys.executable, "-c", "import sys; print('cannot load the model'); sys.exit(1)"]
    with pytest.raises(ServerUnavailable, match="exited: cannot load the model"):
        ServerProcess(lambda port, tmp: crash, name="crasher")


def test_serve_option_defaults_and_the_child_server_command_line():
    args = resolve(parser().parse_args(["--serve", "--threads", "2", "--clients", "20", "--draft-quant", "none",
                                        "--no-lookup"]))
    assert (args.tasks, args.modes, args.prompts, args.settings) == ("humaneval,explain", "auto", "8", "greedy,sample")
    assert (args.clients, args.slots) == ("20", "1,4")
    argv = serve_argv(args)
    served = build_parser().parse_args(["serve", *argv, "-k", "auto"])
    assert served.threads == 2 and served.draft_quant == "none" and served.lookup is False
    assert served.max_queue == 20  # every client fits in the queue: no 429 in a measurement
    assert served.target == args.target and served.draft == args.draft
    # The bench's models get a short context, not the trained 32k; a server gets what its slots need.
    assert served.ctx_size == BENCH_CONTEXT and model_options(args).ctx_size == BENCH_CONTEXT
    assert build_parser().parse_args(["serve", *serve_argv(args, n_ctx=700)]).ctx_size == 700


def test_reset_erases_every_slot_of_our_server_so_a_load_finds_no_earlier_prompt():
    class Attached(ServerProcess):  # the reset of a started `specsample serve`, on a toy app
        def __init__(self, url, parallel):
            self.url, self.parallel = url, parallel

    app, _ = toy_app(drafter="model", parallel=2)
    with running(app) as url:
        client = OpenAI(base_url=url + "/v1", api_key="none")
        def cached():
            answer = client.completions.create(**_body(0))
            return answer.usage.prompt_tokens_details.cached_tokens if answer.usage.prompt_tokens_details else 0
        cached()
        assert cached() > 0  # cache_prompt is on by default: the same prompt again is held
        Attached(url, parallel=2).reset([])
        assert cached() == 0
