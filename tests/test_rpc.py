"""The RPC worker set's options, checked before any model loads (rpc.py, assemble.py)."""

import pytest

from specsample.app.assemble import ModelOptions, OptionError, check_options
from specsample.backends.rpc import RpcUnsupported, Workers, parse_workers, require_rpc

pytestmark = pytest.mark.pure


def test_workers_parse_with_and_without_a_split_and_key_the_cost_cache_by_the_set():
    workers = parse_workers("127.0.0.1:50052, 10.0.0.2:50053")
    assert workers == Workers(("127.0.0.1:50052", "10.0.0.2:50053"))
    split = parse_workers("a:1,b:2", "3,1")
    assert split.split == (3.0, 1.0)
    assert len({workers.key, split.key, parse_workers("a:1,b:2").key, parse_workers("b:2,a:1").key}) == 4


@pytest.mark.parametrize("endpoints, split, named", [
    ("127.0.0.1", None, "host:port"), ("h:0", None, "host:port"), ("h:70000", None, "host:port"),
    (":5", None, "host:port"), ("", None, "no worker"), ("a:1,b:2", "1", "2 workers"),
    ("a:1", "x", "numbers"), ("a:1,b:2", "0,0", "sum above 0"), ("a:1,b:2", "-1,2", ">= 0"),
])
def test_a_bad_worker_list_or_split_is_one_line_naming_it(endpoints, split, named):
    with pytest.raises(ValueError, match=named):
        parse_workers(endpoints, split)


def test_the_options_refuse_rpc_off_llamacpp_and_a_split_without_workers():
    with pytest.raises(OptionError, match="--target-rpc places a llama.cpp target"):
        check_options(ModelOptions(target="some/model", backend="hf", target_rpc="127.0.0.1:50052"), drafting=False)
    with pytest.raises(OptionError, match="--tensor-split"):
        check_options(ModelOptions(target="x.gguf", backend="llamacpp", tensor_split="1,1"), drafting=False)
    with pytest.raises(OptionError, match="host:port"):
        check_options(ModelOptions(target="x.gguf", backend="llamacpp", target_rpc="nowhere"), drafting=False)


def test_a_build_without_rpc_is_refused_with_how_to_get_it():
    class NoRpc:
        @staticmethod
        def llama_supports_rpc():
            return False

    with pytest.raises(RpcUnsupported, match="without RPC support.*make"):
        require_rpc(NoRpc())


def test_the_bench_on_workers_runs_only_our_modes_never_a_peer_that_would_load_the_target_here():
    from argparse import Namespace

    from specsample.app.arguments import UsageError
    from specsample.bench.options import check_remote_modes

    check_remote_modes(Namespace(target_rpc="h:1"), ["ar", "spec-auto"])
    check_remote_modes(Namespace(target_rpc=None), ["llamacpp-spec"])
    with pytest.raises(UsageError, match="llamacpp-spec would run it here"):
        check_remote_modes(Namespace(target_rpc="h:1"), ["ar", "llamacpp-spec"])


def test_workers_share_our_cores_when_one_may_run_where_we_may():
    """Drafting during a target call (decoding/overlap.py) pays only where the workers
    leave this process's cores idle: on other machines, or pinned elsewhere here."""
    import os

    from specsample.backends.rpc import shares_our_cores

    workers = parse_workers("127.0.0.1:1")
    assert shares_our_cores(workers, pids={os.getpid()})  # a worker here, unpinned: on our cores
    assert not shares_our_cores(workers, pids=set())  # none here: another machine
    assert shares_our_cores(workers, pids={1 << 30})  # one we cannot read: assumed to share
