import pytest

from specsample.bench.cli import bench_config, resolve_options
from specsample.cli import UsageError, build_parser


def _args(*argv):
    return resolve_options(build_parser().parse_args(["bench", *argv]))


def test_demo_preset_and_an_explicit_override():
    args = _args("--preset", "demo", "--prompts", "2")
    config = bench_config(args)
    assert config.tasks == ("humaneval",) and config.settings == ("greedy",)
    assert config.prompts == 2 and config.max_new_tokens == 64  # explicit option beats the preset
    assert args.modes == "ar,spec,ngram" and args.ks == "3" and config.parity_prompts == 0


def test_defaults_run_everything():
    args = _args()
    config = bench_config(args)
    assert config.tasks == ("humaneval", "prose", "copy") and config.settings == ("greedy", "sample")
    assert args.ks == "1,2,3,4,6,8" and args.modes == "auto" and config.parity_prompts > 0
    assert bench_config(_args("--no-parity")).parity_prompts == 0


def test_unknown_task_is_a_usage_error():
    with pytest.raises(UsageError):
        bench_config(_args("--tasks", "humaneval,nope"))
