from dataclasses import fields

import pytest

from specsample.app.arguments import UsageError, model_options
from specsample.app.assemble import ModelOptions
from specsample.bench import cli as bench_cli
from specsample.bench.options import bench_config, parse_prompts, resolve_options
from specsample.cli import build_parser

from test_assemble import other_value

pytestmark = pytest.mark.pure


def _args(*argv):
    return resolve_options(build_parser().parse_args(["bench", *argv]))


def _research_args(*argv):
    from benchmarks.bench import parser, resolve

    return resolve(parser().parse_args(list(argv)))


def test_demo_preset_and_an_explicit_override():
    args = _research_args("--preset", "demo", "--prompts", "2")
    config = bench_config(args)
    assert config.tasks == ("humaneval", "chat") and config.settings == ("greedy",)
    assert config.prompt_count("humaneval") == 2  # explicit option beats the preset
    assert config.new_tokens("humaneval") == 384  # full answers: the task's own limit
    assert args.modes == "ar,spec-auto,spec,llamacpp-server,llamacpp-spec" and args.ks == "4"
    assert args.target_quants == "q4_k_m,bf16"  # both regimes: the file as shipped and its bf16 re-encoding


def test_a_prompts_file_is_a_task_that_runs_whole(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text('{"prompt": "Write a haiku.", "kind": "writing"}\n\n# a comment\n'
                    '{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]}\n'
                    '{"prompt": "Translate: bonjour", "kind": "translation", "id": "t1"}\n')
    config = bench_config(_args("--prompts-file", str(path)))
    assert config.tasks == ("prompts",) and config.prompt_count("prompts") == 3
    from specsample.bench.tasks import load_task

    first, chat, third = load_task("prompts")
    assert (first.kind, first.messages) == ("writing", ({"role": "user", "content": "Write a haiku."},))
    assert chat.kind is None and chat.messages[0] == {"role": "system", "content": "Be brief."}
    assert third.id == "t1"
    beside = bench_config(_args("--prompts-file", str(path), "--tasks", "humaneval", "--prompts", "prompts=2"))
    assert beside.tasks == ("humaneval", "prompts") and beside.prompt_count("prompts") == 2


@pytest.mark.parametrize("line,message", [
    ('{"text": "hi"}', "either \"prompt\" or \"messages\""),
    ('{"prompt": "a", "messages": []}', "either"),
    ('not json', "either"),
    ('{"prompt": "  "}', "non-empty string"),
    ('{"messages": [{"role": "robot", "content": "x"}]}', "one of system"),
    ('{"prompt": "a", "kind": "a/b"}', "without '/'"),
])
def test_a_bad_prompts_file_names_its_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "fine"}\n' + line + "\n")
    with pytest.raises(UsageError, match=f"bad.jsonl:2: .*{message}"):
        _args("--prompts-file", str(path))


def test_defaults_run_the_bench_tasks_on_enough_prompts_and_the_research_bench_every_task():
    from benchmarks.bench import parser, resolve

    args = _args()
    config = bench_config(args)
    assert config.tasks == ("humaneval", "chat")
    assert config.settings == ("greedy", "sample")
    assert all(config.prompt_count(t) >= 8 for t in config.tasks)
    assert args.modes == "auto"
    research = bench_config(resolve(parser().parse_args([])))
    assert research.tasks == ("humaneval", "summarize", "humaneval-chat", "copy", "structured")
    assert research.settings == ("greedy", "sample") and research.prompt_count("structured") == 8
    assert resolve(parser().parse_args(["--preset", "demo"])).tasks == "humaneval,chat"  # the preset over both


def test_the_research_bench_runs_parity_unless_told_or_given_a_preset_or_prompts_file(tmp_path):
    from benchmarks.bench import parser, resolve

    def research(*argv):
        return resolve(parser().parse_args(list(argv)))

    assert research().parity and research().parity_prompts >= 40 and research().parity_k == 3
    assert not research("--no-parity").parity and not research("--preset", "demo").parity
    path = tmp_path / "mine.jsonl"
    path.write_text('{"prompt": "Write a haiku."}\n')
    assert not research("--prompts-file", str(path)).parity
    assert research("--prompts-file", str(path), "--parity-prompts", "4").parity_prompts == 4


def test_per_task_prompt_counts_and_a_token_cap():
    config = bench_config(_args("--tasks", "humaneval,chat", "--prompts", "humaneval=8,chat=4", "--max-new-tokens", "16"))
    assert (config.prompt_count("humaneval"), config.prompt_count("chat")) == (8, 4)
    assert config.new_tokens("chat") == 16
    with pytest.raises(UsageError, match="--max-new-tokens must be >= 1"):
        bench_config(_args("--max-new-tokens", "0"))


@pytest.mark.parametrize("text", ["eight", "humaneval=x", "nope=3", "0", "humaneval=0", "8,4"])
def test_bad_prompt_counts_are_usage_errors(text):
    with pytest.raises(UsageError):
        parse_prompts(text, ("humaneval",))


def test_unknown_task_is_a_usage_error():
    with pytest.raises(UsageError):
        bench_config(_args("--tasks", "humaneval,nope"))


def test_help_lists_the_tasks_and_leaves_the_peers_to_the_research_bench(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name in ("humaneval", "explain", "chat", "--prompts-file", "--url"):
        assert name in text
    for research in ("--budget-minutes", "--neighbour", "--rpc-delay-ms", "--no-parity", "--cost-reps", "hf-assisted",
                     "--slots", "llamacpp-spec", "--llama-server", "--preset", "--target-quants", "--no-plots"):
        assert research not in text  # benchmarks/bench.py's, not the installed bench's


def test_the_research_bench_offers_the_bench_and_its_own_options(capsys):
    from benchmarks.bench import main

    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name in ("--prompts-file", "--target-quants", "--budget-minutes", "--neighbour", "--rpc-delay-ms",
                 "--no-parity", "--cost-reps", "hf-assisted", "llamacpp-lookup", "--slots", "summarize", "structured",
                 "fim", "llamacpp-spec", "--llama-server", "--preset", "--no-plots"):
        assert name in text


@pytest.fixture
def q4_k_m_file(monkeypatch, tmp_path):
    from specsample.backends import reencode

    path = tmp_path / "target.gguf"
    path.write_bytes(b"GGUF")
    monkeypatch.setattr(reencode, "file_type", lambda p: "q4_k_m")
    return str(path)


def test_target_types_name_the_file_by_its_own_type(q4_k_m_file):
    from benchmarks.targets import target_types

    assert target_types(_research_args("--target", q4_k_m_file)) == [(None, "none")]
    assert target_types(_research_args("--target", q4_k_m_file, "--target-quant", "f16")) == [(None, "f16")]
    got = target_types(_research_args("--target", q4_k_m_file, "--target-quants", "q4_k_m,bf16"))
    assert got == [("q4_k_m", "none"), ("bf16", "bf16")]


@pytest.mark.parametrize("argv,message", [
    (["--target-quants", "q5_k_m"], "unknown --target-quants type 'q5_k_m'; choose from q4_k_m, bf16, f16, q8_0"),
    (["--target-quants", "bf16", "--target-quant", "f16"], "not both"),
])
def test_bad_target_types_are_usage_errors(q4_k_m_file, argv, message):
    from benchmarks.targets import target_types

    with pytest.raises(UsageError, match=message):
        target_types(_research_args("--target", q4_k_m_file, *argv))


def test_target_quants_go_with_serve_to_the_serving_run(q4_k_m_file, monkeypatch):
    from benchmarks import bench

    monkeypatch.setattr(bench.serve_run, "run", lambda args: args.target_quants)
    assert bench.main(["--target", q4_k_m_file, "--serve", "--target-quants", "q4_k_m,bf16"]) == "q4_k_m,bf16"
    monkeypatch.setattr("specsample.bench.serve_run.run", lambda args: "served")
    assert bench_cli.cmd_bench(_args("--target", q4_k_m_file, "--serve")) == "served"


def test_bench_serve_without_an_endpoint_says_where_started_servers_went(capsys):
    from specsample.cli import main

    assert main(["bench", "serve"]) == 2
    err = capsys.readouterr().err
    assert "give --url [NAME=]URL" in err and "python -m benchmarks.bench --serve" in err


def test_no_native_server_is_none_when_unasked_and_a_reason_when_it_cannot_run():
    from benchmarks.native import start_server
    from benchmarks.servers import ServerUnavailable

    args = _research_args("--draft", "ngram")
    assert start_server(args, ["ar", "spec-auto"], 512, 4, None) is None
    with pytest.raises(ServerUnavailable, match="needs a draft model"):
        start_server(args, ["ar", "llamacpp-spec"], 512, 4, None)


def test_the_llama_server_binary_is_the_one_named_or_the_pinned_build(monkeypatch, tmp_path):
    from benchmarks.native import llama_server_binary, server_path
    from benchmarks.servers import ServerUnavailable

    monkeypatch.setenv("SPECSAMPLE_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ServerUnavailable, match="python -m benchmarks.llama_server builds it"):
        llama_server_binary()
    with pytest.raises(ServerUnavailable, match="--llama-server .*mine: no such file"):
        llama_server_binary(tmp_path / "mine")
    (tmp_path / "mine").write_bytes(b"\x7fELF")
    assert llama_server_binary(tmp_path / "mine") == tmp_path / "mine"
    server_path().parent.mkdir(parents=True)
    server_path().write_bytes(b"\x7fELF")
    assert llama_server_binary() == server_path() and _research_args().llama_server is None


# Every model option away from its default, so that one dropped on the way shows.
CHANGED = ModelOptions(**{f.name: other_value(f) for f in fields(ModelOptions)})


@pytest.mark.pure
def test_served_children_get_every_model_option():
    from benchmarks.bench import parser
    from benchmarks.serving import serve_argv

    args = parser().parse_args(["--serve", *CHANGED.argv()])
    argv = serve_argv(args)
    assert model_options(args) == CHANGED and model_options(build_parser().parse_args(["serve", *argv])) == CHANGED
    assert argv[-4:] == ["--max-queue", "16", "--queue-timeout", "3600"]


@pytest.mark.pure
def test_the_harness_servers_get_every_model_option(monkeypatch, tmp_path):
    """The harness passed only four options on, so --threads, --dtype, --draft-quant and
    --lookup never reached its servers."""
    from benchmarks import serving
    from benchmarks.studies import harness

    started = []

    class Stop(Exception):
        pass

    def server(model_argv, extra, name):
        started.append(model_argv)
        raise Stop  # before any server starts

    monkeypatch.setattr(serving, "specsample_server", server)
    with pytest.raises(Stop):
        harness.main([*CHANGED.argv(), "--out", str(tmp_path)])
    assert model_options(build_parser().parse_args(["serve", *started[0]])) == CHANGED


def test_k_max_reaches_the_spec_auto_mode_and_a_bad_one_is_a_usage_error():
    from specsample.bench.modes import build_modes
    from specsample.bench.options import draft_lengths

    with pytest.raises(UsageError, match="--k-max must be >= 1"):
        draft_lengths(_args("--k-max", "0"))
    assert _args().k_max == 8  # generate's and serve's default
    modes, _ = build_modes(["spec-auto", "spec"], [2], [3], target=None, draft=object(), k_max=12)
    auto, fixed = modes
    assert auto.policy.k_max == 12
    assert fixed.policy.k_max == 2  # a fixed K drafts K, whatever -k auto's ceiling


def test_the_verifier_reaches_our_drafting_modes_and_the_token_families_verify_token_by_token():
    from specsample.bench.modes import AUTO_FAMILIES, build_modes

    assert _args().verifier == "auto" and _args("--verifier", "block").verifier == "block"
    families = ["ar", "spec", "spec-token", "spec-auto", "spec-auto-token", "ngram"]
    modes, _ = build_modes(families, [2], [3], target=None, draft=object(), verifier="block")
    assert [(m.name, m.family, m.verifier) for m in modes] == [
        ("ar", "ar", "auto"), ("spec-k2", "spec", "block"), ("spec-k2-token", "spec-token", "rejection"),
        ("spec-auto", "spec-auto", "block"), ("spec-auto-token", "spec-auto-token", "rejection"),
        ("ngram-k3", "ngram", "block")]
    assert [m.loop for m in modes] == ["ar", "spec", "spec", "spec-auto", "spec-auto", "ngram"]
    assert "spec-token" not in AUTO_FAMILIES and "spec-auto-token" not in AUTO_FAMILIES  # only when named


def test_threads_are_the_flag_or_torchs_own_count():
    import torch

    from specsample.bench.options import threads

    assert threads(_args("--threads", "3")) == 3
    assert threads(_args()) == torch.get_num_threads()


def test_the_research_bench_reports_its_own_command_and_the_bench_its_own(monkeypatch):
    from benchmarks import bench
    from specsample.bench.options import command_line

    class Research:  # no bandwidth probe: only the command is looked at
        def __init__(self, args):
            pass

        def close(self):
            pass

    seen = []
    monkeypatch.setattr(bench, "Research", Research)
    monkeypatch.setattr(bench.sequence_run, "run", lambda args, research: seen.append(command_line(args)) or 0)
    assert bench.main(["--preset", "demo", "--prompts", "1"]) == 0
    assert seen == ["python -m benchmarks.bench --preset demo --prompts 1"]
    monkeypatch.setattr("sys.argv", ["specsample", "bench", "--prompts", "1"])
    assert command_line(_args("--prompts", "1")) == "specsample bench --prompts 1"
