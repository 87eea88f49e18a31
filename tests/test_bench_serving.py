"""`bench serve` runs: every server of a slot count up at once, each load sent to
every mode in turn, --repeats times, the order turning by one from round to round,
under every client count, task and setting; llama-server's slots and their reset
between loads; the axes on the command line. Fake servers and a fake load client:
nothing starts."""

from pathlib import Path

import pytest

from specsample.app.arguments import UsageError
from specsample.bench.load import Load, rotation
from specsample.bench.options import counts, draft_lengths, resolve_options, serve_clients
from specsample.bench.records import RequestTiming
from specsample.bench.runner import PreparedPrompt
from benchmarks.servers import ServerUnavailable
from specsample.bench.tasks import TASKS, Prompt
from specsample.cli import build_parser

from benchmarks import serving
from benchmarks.bench import parser, resolve
from benchmarks.serving import our_server_flags, run_serving, serve_argv, served_modes

from bench_helpers import FakeServer

pytestmark = pytest.mark.pure


def _prompts(task, n):
    return [PreparedPrompt(Prompt(task, f"{task}/{i}", "text"), TASKS[task], [10 + i, 20 + i]) for i in range(n)]


@pytest.fixture
def fake_run(monkeypatch):
    """Our servers and the load client replaced: returns the events (starts, resets,
    loads as 'load <server> <clients> <requests>', closes) and the flags each of our
    servers was started with."""
    events, flags = [], []

    def specsample_server(model_argv, extra, name, parallel=1):
        flags.append(extra)
        return FakeServer(name, events)

    def run_load(api_base, bodies, clients):
        events.append(f"load {api_base.removeprefix('http://').removesuffix('/v1')} {clients} {len(bodies)}")
        timings = [RequestTiming(i, 0.0, 0.5, 1.0, 4) for i in range(len(bodies))]
        return timings, 2.0

    monkeypatch.setattr(serving, "specsample_server", specsample_server)
    monkeypatch.setattr(serving, "run_load", run_load)
    return events, flags


def test_every_server_of_a_slot_count_is_up_while_each_load_goes_round_them_in_turn(fake_run):
    events, flags = fake_run
    modes = served_modes(["ar", "llamacpp-server", "llamacpp-spec"], [3], [3, 4])
    load = Load({"humaneval": _prompts("humaneval", 3), "explain": _prompts("explain", 2)}, ("greedy", "sample"),
                (1, 4), lambda task: TASKS[task].max_new_tokens, repeats=2)
    kept = []
    records, notes, splits = run_serving(modes, load, (1, 2), model_argv=["--threads", "2"],
                                         llama_server=lambda n: FakeServer(f"llama-np{n}", events), log=lambda msg: None,
                                         keep=kept.append)
    assert [r for done in kept for r in done] == records  # each load's records as soon as it ended
    assert len(kept) == 2 * 2 * 2 * 2 * 4 * 2  # slot counts x client counts x tasks x settings x modes x repeats
    ar1, ar2 = (f"specsample serve --autoregressive --parallel {n}" for n in (1, 2))
    starts = [e for e in events if e.startswith(("start", "close"))]
    assert starts == [f"start {ar1}", "start llama-np1",  # both llamacpp modes share one process per slot count
                      f"close {ar1}", "close llama-np1", f"start {ar2}", "start llama-np2", f"close {ar2}",
                      "close llama-np2"]
    assert flags == [["--autoregressive", "--parallel", "1"], ["--autoregressive", "--parallel", "2"]]
    one = events[:events.index(f"close {ar1}")]
    # A one-request warm-up per mode, then every load on each mode, each after its server's reset.
    assert one[:6] == [f"start {ar1}", f"load {ar1} 1 1", "start llama-np1"] + ["load llama-np1 1 1"] * 3
    loads = [e for e in one[6:] if e.startswith("load")]
    assert len(loads) == 2 * 2 * 2 * 4 * 2  # (client counts x tasks x settings) loads, each on 4 modes, twice
    assert all(e.startswith("reset") for e in one[6::2]) and len(one[6:]) == 2 * len(loads)
    # Two passes over the loads, one after the other: the same clients and requests in the same order.
    rounds = [e.split()[-2:] for e in loads[::4]]
    assert rounds[:8] == [["1", "3"], ["1", "3"], ["1", "2"], ["1", "2"], ["4", "3"], ["4", "3"], ["4", "2"],
                          ["4", "2"]] and rounds[8:] == rounds[:8]
    # Each round starts one mode further on, across both passes: ar first, then last, third, second, first again.
    in_turn = [r.mode for r in records if r.slots == 1 and r.prompt_id.endswith("/0")]
    rounds = [in_turn[i:i + 4] for i in range(0, len(in_turn), 4)]
    order = ["ar", "llamacpp-server", "llamacpp-spec-k3", "llamacpp-spec-k4"]
    assert rounds == [order[i % 4:] + order[:i % 4] for i in range(16)]
    assert [r.repeat for r in records if r.slots == 1 and r.prompt_id == "humaneval/0"] == [0] * 16 + [1] * 16
    assert notes == []
    # One record per request: 4 modes x 2 slot counts x 2 client counts x 2 settings x (3 + 2) prompts, twice.
    assert len(records) == 4 * 2 * 2 * 2 * 5 * 2
    assert len({(r.mode, r.slots, r.clients, r.task, r.setting, r.repeat) for r in records}) == 4 * 2 * 2 * 2 * 2 * 2
    assert all(r.wall_seconds == 2.0 and r.target is None for r in records)
    # A split per load of our server (ar: 2 slot counts x 2 client counts x 2 tasks x 2 settings x 2), none of llama-server's.
    assert len(splits) == 2 * 2 * 2 * 2 * 2 and {s.mode for s in splits} == {"ar"}


@pytest.mark.parametrize("n,i,order", [(3, 0, "ABC"), (3, 1, "BCA"), (3, 2, "CAB"), (3, 4, "BCA"), (2, 3, "BA"),
                                       (1, 5, "A")])
def test_rotation_turns_the_order_by_one_a_round(n, i, order):
    assert "".join(rotation(list("ABC"[:n]), i)) == order


def test_each_server_takes_each_place_equally_often_over_the_rounds():
    load = Load({"t": [], "u": []}, ("greedy",), (1, 2), lambda task: 8, repeats=3)
    rounds = load.rounds(["A", "B", "C"])
    assert [(repeat, one) for repeat, one, _ in rounds[:5]] == [(0, (1, "t", "greedy")), (0, (1, "u", "greedy")),
                                                               (0, (2, "t", "greedy")), (0, (2, "u", "greedy")),
                                                               (1, (1, "t", "greedy"))]
    assert len(rounds) == 4 * 3  # (clients x tasks x settings) x repeats
    places = {(server, order.index(server)) for _, _, order in rounds for server in order}
    assert all(sum(order.index(s) == place for _, _, order in rounds) == 4 for s, place in places)


def test_a_server_that_cannot_start_is_a_note_and_the_others_still_run(fake_run):
    events, _ = fake_run

    def no_llama(n):
        raise ServerUnavailable("cmake not found")

    load = Load({"humaneval": _prompts("humaneval", 1)}, ("greedy",), (2,), lambda task: 16)
    records, notes, _ = run_serving(served_modes(["ar", "llamacpp-spec"], [3], [3]), load, (4,), model_argv=[],
                                    llama_server=no_llama, log=lambda msg: None)
    assert notes == ["not run: llamacpp-spec-k3, 4 slots: cmake not found"]
    assert [(r.mode, r.slots, r.clients) for r in records] == [("ar", 4, 2)]


def test_requests_not_answered_are_noted_with_their_statuses(fake_run, monkeypatch):
    def refusing_load(api_base, bodies, clients):
        timings = [RequestTiming(0, 0.0, 0.5, 1.0, 4), RequestTiming(1, 0.0, None, 0.1, 0, error="429 busy", status=429),
                   RequestTiming(2, 0.0, None, 0.1, 0, error="ConnectError")]
        return timings[:len(bodies)], 1.0

    monkeypatch.setattr(serving, "run_load", refusing_load)
    load = Load({"humaneval": _prompts("humaneval", 3)}, ("greedy",), (8,), lambda task: 16)
    records, notes, splits = run_serving(served_modes(["spec-auto"], [3], [3]), load, (4,), model_argv=[],
                                         llama_server=None, log=lambda msg: None)
    assert [r.timing.outcome for r in records] == ["answered", "refused", "lost"]
    # Our server's /metrics around the load: one call of 8 tokens, a second busy, the load's wall time.
    [split] = splits
    assert (split.mode, split.task, split.slots, split.clients, split.wall_seconds) == ("spec-auto", "humaneval", 4, 8, 1.0)
    assert split.calls == {"target": {4: [1.0, 8.0, 0.25]}} and split.busy_seconds == 1.0
    assert notes == ["spec-auto, 4 slots, 8 clients, humaneval greedy, repeat 1: 2 of 3 requests not answered "
                     "(statuses: 429); first: 429 busy"]


def test_our_servers_always_get_their_slot_count():
    ar, auto, spec = served_modes(["ar", "spec-auto", "spec"], [4], [3])
    assert our_server_flags(ar, 1) == ["--autoregressive", "--parallel", "1"]
    assert our_server_flags(auto, 4) == ["-k", "auto", "--parallel", "4"]
    assert our_server_flags(spec, 2) == ["-k", "4", "--parallel", "2"]
    # --trace: a file for each -k auto server, named by its mode and slots; the others have no planner to trace.
    assert our_server_flags(auto, 4, Path("/t/run.jsonl")) == ["-k", "auto", "--parallel", "4", "--trace",
                                                               "/t/run-spec-auto-4slots.jsonl"]
    assert our_server_flags(ar, 4, Path("/t/run.jsonl")) == our_server_flags(ar, 4)
    assert our_server_flags(spec, 4, Path("/t/run.jsonl")) == our_server_flags(spec, 4)


def _args(*argv):
    return resolve(parser().parse_args(["--serve", *argv]))


def test_clients_and_slots_are_axes():
    args = _args("--clients", "1,4,8", "--slots", "1,4")
    assert (serve_clients(args), counts(args.slots, "--slots")) == ((1, 4, 8), (1, 4))
    assert (serve_clients(_args()), _args().slots) == ((4,), "1,4")
    assert serve_argv(_args("--clients", "1,32,8"))[-4:] == ["--max-queue", "32", "--queue-timeout", "3600"]
    argv = serve_argv(_args(), "bf16")
    assert argv[argv.index("--target-quant") + 1] == "bf16"  # each --target-quants type on its own server


def test_bench_serve_is_bench_dash_dash_serve_and_its_loads_repeat_three_times():
    def parsed(*argv):
        return resolve_options(build_parser().parse_args(["bench", *argv]))

    spelled, flagged, url = parsed("serve"), parsed("--serve"), parsed("--url", "http://h:1")
    assert spelled.serve and flagged.serve and url.serve  # --url alone asks for the serving load
    assert spelled.repeats == flagged.repeats == url.repeats == 3 and url.tasks == "humaneval,explain"
    assert parsed("serve", "--repeats", "5").repeats == 5
    per_sequence = parsed()
    assert not per_sequence.serve and per_sequence.repeats is None
    with pytest.raises(SystemExit):  # a word other than serve is not a sub-mode
        build_parser().parse_args(["bench", "serving"])


@pytest.mark.parametrize("argv,message", [
    (["--repeats", "0"], "--repeats must be >= 1"),
    (["--clients", "0"], "--clients must be >= 1"),
    (["--slots", "1,x"], "--slots takes N or a comma list of N"),
    (["--ks", "0"], "--ks must be >= 1"),
])
def test_bad_axes_are_usage_errors(argv, message):
    args = _args(*argv)
    with pytest.raises(UsageError, match=message):
        serve_clients(args)
        counts(args.slots, "--slots")
        draft_lengths(args)
