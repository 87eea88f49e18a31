"""`bench --serve`: the load client against a toy server, the report, the server
processes and the command line."""

import json
import sys

import pytest
from openai import OpenAI

from specsample.bench.cli import resolve_options, serve_argv
from specsample.bench.load import RequestTiming, run_load, summarise_load
from specsample.bench.modes import SETTINGS
from specsample.bench.report import write_serve_report
from specsample.bench.servers import ServerProcess, ServerUnavailable
from specsample.bench.serving import ServedMode, ServedRecord, serve_sections, serve_table, served_modes
from specsample.cli import build_parser

from serve_helpers import WordTokenizer, running, toy_app

pytestmark = pytest.mark.system

PROMPTS = ["the cat sat on a mat", "a dog ran far away", "the big red dog", "it was over here"]


def _body(i: int, **extra) -> dict:
    ids = WordTokenizer().encode(PROMPTS[i % len(PROMPTS)])
    return {"model": "toy", "prompt": ids, "max_tokens": 12, "temperature": 1.0, "seed": i, **extra}


def test_load_from_concurrent_clients_times_every_request_and_keeps_its_text():
    app, _ = toy_app(eos=False)
    bodies = [_body(i) for i in range(8)] + [_body(8, temperature=-1)]  # the last one is refused
    with running(app) as url:
        timings, wall = run_load(url, bodies, concurrency=3)
        client = OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        whole = [client.completions.create(**_body(i)).choices[0].text for i in range(8)]
    assert [t.index for t in timings] == list(range(9))
    ok, refused = timings[:8], timings[8]
    assert [t.text for t in ok] == whole  # streamed text is the whole answer, each with its own seed
    assert all(t.error is None and t.completion_tokens == 12 and t.finish_reason == "length" for t in ok)
    assert all(0 < t.first_text <= t.finished <= wall for t in ok)
    assert all(t.drafted >= t.accepted and t.drafted > 0 for t in ok)  # the toy server drafts k=3
    assert refused.error is not None and "temperature" in refused.error

    summary = summarise_load(timings, concurrency=3, wall_seconds=wall)
    assert (summary.requests, summary.errors, summary.completion_tokens) == (8, 1, 96)
    assert len(summary.ttft) == len(summary.tpot) == 8
    assert summary.requests_per_second == pytest.approx(8 / wall)
    assert summary.quantile("ttft", 50) <= summary.quantile("ttft", 99)


def test_time_per_output_token_leaves_out_the_first_token():
    t = RequestTiming(0, 0.0, first_text=1.0, finished=3.0, completion_tokens=5)
    assert t.tpot == pytest.approx(0.5)
    assert RequestTiming(0, 0.0, first_text=1.0, finished=1.0, completion_tokens=1).tpot is None


def _record(mode, setting, prompt, text, tokens, wall=2.0, error=None, **timing):
    timing = RequestTiming(**{"index": int(prompt[-1]), "sent": 0.0, "first_text": 0.5, "finished": 1.5,
                              "completion_tokens": tokens, "chunk_gaps": [0.1], "text": text, "finish_reason": "stop",
                              "error": error, **timing})
    return ServedRecord(mode, mode, None, "humaneval", setting, prompt, 2, wall, timing)


def test_serve_table_compares_each_server_with_ar_and_counts_identical_greedy_answers():
    records = [_record("ar", "greedy", "p0", "a", 10), _record("ar", "greedy", "p1", "b", 10),
               _record("spec-auto", "greedy", "p0", "a", 10, wall=1.0, drafted=8, accepted=6),
               _record("spec-auto", "greedy", "p1", "c", 10, wall=1.0, drafted=4, accepted=2)]
    table = serve_table(records)
    ar_row, spec_row = table.splitlines()[2:4]
    assert "| 10.00 | 1.00 |" in ar_row  # 20 tokens in 2 s
    assert "| 20.00 | 2.00 |" in spec_row and spec_row.endswith("| 0.67 |")  # 8 of 12 drafts accepted
    failed = [_record("ar", "greedy", "p2", "x", 10), _record("spec-auto", "greedy", "p2", "x", 4, error="boom")]
    identity = serve_sections(records + failed)[0][-1]
    assert "| spec-auto | 1/2 |" in identity  # the failed request is left out, whatever text it streamed


def test_the_serve_report_keeps_every_request_and_the_command(tmp_path):
    records = [_record("ar", "greedy", "p0", "a", 10), _record("spec-auto", "greedy", "p0", "a", 10, error="boom")]
    sections, table = serve_sections(records)
    write_serve_report(tmp_path, records, sections, command="specsample bench --serve", machine="m", notes=["a note"])
    report = (tmp_path / "serve.md").read_text()
    assert table in report and "`specsample bench --serve`" in report and "- a note" in report
    lines = (tmp_path / "serve.jsonl").read_text().splitlines()
    assert [json.loads(line)["mode"] for line in lines] == ["ar", "spec-auto"]
    assert [ServedRecord.from_json(json.loads(line)) for line in lines] == records  # flat on disk, whole on reading


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
    args = resolve_options(build_parser().parse_args(["bench", "--serve", "--threads", "2", "--clients", "20",
                                                      "--draft-quant", "none", "--no-lookup"]))
    assert (args.tasks, args.modes, args.prompts, args.settings) == ("humaneval", "auto", "8", "greedy,sample")
    argv = serve_argv(args)
    served = build_parser().parse_args(["serve", *argv, "-k", "auto"])
    assert served.threads == 2 and served.draft_quant == "none" and served.lookup is False
    assert served.max_queue == 20  # every client fits in the queue: no 429 in a measurement
    assert served.target == args.target and served.draft == args.draft
