"""The RPC worker set's options, checked before any model loads (rpc.py, assemble.py)."""

import pytest

from specsample.app.assemble import ModelOptions, OptionError, check_options
from specsample.backends.rpc import RpcUnsupported, RpcWorkers, parse_workers, require_rpc

pytestmark = pytest.mark.pure


def test_workers_parse_with_and_without_a_split_and_key_the_cost_cache_by_the_set():
    workers = parse_workers("127.0.0.1:50052, 10.0.0.2:50053")
    assert workers == RpcWorkers(("127.0.0.1:50052", "10.0.0.2:50053"))
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
    from benchmarks.peers import check_remote_modes

    check_remote_modes(Namespace(target_rpc="h:1"), ["ar", "spec-auto"])
    check_remote_modes(Namespace(target_rpc=None), ["llamacpp-spec"])
    with pytest.raises(UsageError, match="llamacpp-spec would run it here"):
        check_remote_modes(Namespace(target_rpc="h:1"), ["ar", "llamacpp-spec"])
    with pytest.raises(UsageError, match="--draft-rpc runs the draft.*hf-assisted would run it here"):
        check_remote_modes(Namespace(target_rpc=None, draft_rpc="h:1"), ["spec-auto", "hf-assisted"])


def test_workers_share_our_cores_when_one_may_run_where_we_may():
    """Drafting during a target call (decoding/overlap.py) pays only where the workers
    leave this process's cores idle: on other machines, or pinned elsewhere here."""
    import os

    from specsample.backends.rpc import cores

    workers, ours = parse_workers("127.0.0.1:1"), cores(None)
    assert cores(workers, pids={os.getpid()}) & ours  # a worker here, unpinned: on our cores
    assert not cores(workers, pids=set()) & ours  # none here: another machine
    assert cores(workers, pids={1 << 30}) & ours  # one we cannot read: assumed to share


def test_target_and_draft_are_apart_only_where_neither_may_run_on_the_others_cores():
    """Where the overlap pays (assemble.pair_overlaps): one model on workers whose cores the
    other cannot take turns on. A remote endpoint shares only with itself."""
    import os

    from specsample.backends.rpc import apart, cores

    remote, other = parse_workers("10.255.255.1:50052"), parse_workers("10.255.255.2:50052")
    assert not apart(None, None)  # both here
    assert apart(remote, None) and apart(None, remote) and apart(remote, other)
    assert not apart(remote, remote)  # one worker holding both models computes one call at a time
    here = parse_workers("127.0.0.1:1")
    assert cores(here, pids={os.getpid()}) == os.sched_getaffinity(0)
    assert cores(here, pids=set()) == set()  # nothing listens here on that port: no cores of ours
    assert cores(here, pids={1 << 30}) == set(range(os.cpu_count()))  # unreadable: anywhere


def test_the_draft_worker_option_is_checked_before_any_load():
    def check(**kw):
        return check_options(ModelOptions(target="x.gguf", draft="y.gguf", backend="llamacpp", **kw))

    assert check(draft_rpc="10.0.0.2:50052") == ("llamacpp", "llamacpp")
    with pytest.raises(OptionError, match="--draft-rpc places a llama.cpp draft"):
        check(draft_rpc="10.0.0.2:50052", draft_backend="hf")
    with pytest.raises(OptionError, match="one worker"):
        check(draft_rpc="10.0.0.2:50052,10.0.0.3:50052")
    with pytest.raises(OptionError, match="--draft-rpc.*host:port"):
        check(draft_rpc="nowhere")
    with pytest.raises(OptionError, match="--draft ngram has no model"):
        check_options(ModelOptions(target="x.gguf", draft="ngram", backend="llamacpp", draft_rpc="h:1"))
    with pytest.raises(OptionError, match="drafts nothing"):
        check_options(ModelOptions(target="x.gguf", backend="llamacpp", draft_rpc="h:1"), drafting=False)


def test_the_overlap_is_asked_for_and_needs_target_and_draft_apart():
    from specsample.app.assemble import pair_overlaps

    remote = parse_workers("10.255.255.1:50052")
    assert pair_overlaps(ModelOptions(), "llamacpp", remote, None)
    assert pair_overlaps(ModelOptions(), "llamacpp", None, remote)
    assert not pair_overlaps(ModelOptions(overlap=False), "llamacpp", remote, None)
    assert not pair_overlaps(ModelOptions(), None, remote, None)  # no draft model: nothing to draft meanwhile
    assert not pair_overlaps(ModelOptions(), "llamacpp", None, None)
    assert not pair_overlaps(ModelOptions(), "llamacpp", remote, remote)


def test_a_server_watches_the_target_and_draft_workers_alike():
    from specsample.backends.rpc import joined

    assert joined(None, None) is None
    assert joined(parse_workers("a:1,b:2", "1,1"), parse_workers("b:2")) == RpcWorkers(("a:1", "b:2"))
    assert joined(None, parse_workers("c:3")) == RpcWorkers(("c:3",))


def test_the_bench_delays_the_draft_workers_messages_too(monkeypatch):
    """--rpc-delay-ms puts one relay in front of each worker named, the draft's too."""
    from argparse import Namespace

    from benchmarks import bench as cli

    class Relay:
        def __init__(self, endpoint, delay):
            self.endpoint = "relay-of-" + endpoint

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(cli, "DelayRelay", Relay)
    args = Namespace(rpc_delay_ms=2.0, target_rpc="a:1,b:2", tensor_split="1,1", draft_rpc="b:2")
    with cli.delayed_workers(args):
        assert (args.target_rpc, args.draft_rpc) == ("relay-of-a:1,relay-of-b:2", "relay-of-b:2")
    assert (args.target_rpc, args.draft_rpc) == ("a:1,b:2", "b:2")
    with pytest.raises(cli.UsageError, match="--target-rpc or --draft-rpc"):
        with cli.delayed_workers(Namespace(rpc_delay_ms=2.0, target_rpc=None, draft_rpc=None)):
            pass
