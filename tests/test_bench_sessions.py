"""The agent and editor sessions (benchmarks/sessions.py) and their runner and report
(benchmarks/agents.py), against a fake endpoint: every turn follows from the answers
before it, the same on every server, and the report's ratios are the turns' sums
(pure, a fake `send`); and `send` itself against a local OpenAI-style stream (system)."""

import ast
import json

import pytest

from benchmarks.agents import Server, Turn, run_sessions, send, summarise, table, turn_table
from benchmarks.sessions import (AgentSession, FimSession, Reply, ToolSession, apply_search_replace,
                                 apply_whole_function, find_function, make_sessions, module_source, scripted_edit)

from test_bench_endpoints import FIRST_TEXT_DELAY, OpenAIEndpoint, _Handler, serving


@pytest.mark.pure
def test_search_replace_applies_only_a_block_found_exactly_once():
    source = "def f(a):\n    return a\n\n\ndef g(a):\n    return a\n"
    block = "<<<<<<< SEARCH\ndef f(a):\n    return a\n=======\ndef f(a):\n    return a + 1\n>>>>>>> REPLACE"
    assert apply_search_replace(source, "Here:\n" + block) == source.replace("return a\n\n", "return a + 1\n\n", 1)
    twice = "<<<<<<< SEARCH\n    return a\n=======\n    return 0\n>>>>>>> REPLACE"
    assert apply_search_replace(source, twice) is None  # found twice: ambiguous
    assert apply_search_replace(source, block.replace("def f(a)", "def h(a)")) is None  # not in the file
    assert apply_search_replace(source, "no block here") is None


@pytest.mark.pure
def test_whole_function_replaces_the_named_function_and_nothing_else():
    source = "X = 1\n\n\ndef f(a):\n    return a\n\n\ndef g(b):\n    return b\n"
    new = apply_whole_function(source, "```python\ndef f(a):\n    if a is None:\n        raise TypeError\n"
                                       "    return a\n```", "f")
    assert new == "X = 1\n\n\ndef f(a):\n    if a is None:\n        raise TypeError\n    return a\n\n\ndef g(b):\n" \
                  "    return b\n"
    assert apply_whole_function(source, "```python\ndef h(a):\n    return a\n```", "f") is None
    assert apply_whole_function(source, "```python\ndef f(a:\n```", "f") is None  # not Python


@pytest.mark.pure
@pytest.mark.parametrize("kind", ["guard", "rename", "print"])
def test_each_scripted_edit_changes_only_its_function_and_still_parses(kind):
    source = module_source("colorsys")
    edited = scripted_edit(source, kind, "rgb_to_yiq", "r")
    ast.parse(edited)
    before, after = find_function(source, "rgb_to_yiq"), find_function(edited, "rgb_to_yiq")
    assert ast.unparse(before) != ast.unparse(after)
    above = "".join(source.splitlines(keepends=True)[:before.lineno - 1])
    assert edited.startswith(above) and edited != source
    assert ast.unparse(find_function(edited, "hls_to_rgb")) == ast.unparse(find_function(source, "hls_to_rgb"))


@pytest.mark.pure
def test_an_agent_turn_takes_the_models_edit_where_it_applies_else_the_scripted_one():
    session = AgentSession("bisect", False, 64)
    body = session.body()
    assert session.source in body["messages"][1]["content"] and "insort_right" in body["messages"][1]["content"]
    assert session.source == module_source("bisect")[:len(session.source)] and len(session.source.splitlines()) <= 80
    head = "def insort_right(a, x, lo=0, hi=None, *, key=None):\n"
    own = f"<<<<<<< SEARCH\n{head}=======\n{head}    assert a is not None\n>>>>>>> REPLACE"
    session.observe(Reply(own))
    assert head + "    assert a is not None\n" in session.source and session.applied == [True]
    before = session.source
    session.observe(Reply("I cannot do that."))  # turn 2: the scripted rename of insort_left's first parameter
    assert session.applied == [True, False] and session.source == scripted_edit(before, "rename", "insort_left", "a")
    assert session.source in session.body()["messages"][1]["content"]  # the next turn sends the file as it is now


@pytest.mark.pure
def test_a_tool_loop_appends_the_models_call_or_the_scripted_one_and_the_tools_result():
    session = ToolSession("quopri", 64)  # its file is quopri's first lines
    first = session.body()
    assert session.side_body() is None and [t["function"]["name"] for t in first["tools"]][0] == "search_code"
    session.observe(Reply(tool_calls=[("read_file", json.dumps({"path": "quopri.py", "start_line": 1,
                                                                 "end_line": 3}))]))
    assert session.messages[:2] == first["messages"]  # append-only: the earlier turns stay as they were
    assert session.messages[-1]["content"].splitlines() == ["1: " + module_source("quopri").splitlines()[0],
                                                             "2: " + module_source("quopri").splitlines()[1],
                                                             "3: " + module_source("quopri").splitlines()[2]]
    session.observe(Reply("no call"))  # turn 2 scripted: read_file over the function's lines
    call = session.messages[-2]["tool_calls"][0]["function"]
    assert call["name"] == "read_file" and session.applied == [True, False]
    assert session.side_body()["messages"][1]["content"] == session.messages[-1]["content"]
    assert session.result("nope", "{}") == "error: no tool named nope"
    assert session.result("search_code", "[1]") == "error: the arguments are not an object"


@pytest.mark.pure
def test_fim_prompts_grow_down_the_file_each_extending_the_last():
    session = FimSession("calendar", 64)
    bodies = []
    for _ in range(3):
        bodies.append(session.body())
        session.observe(Reply("x"))
    source = module_source("calendar")
    for a, b in zip(bodies, bodies[1:]):
        assert b["prompt"].startswith(a["prompt"]) and len(b["prompt"]) > len(a["prompt"])
    for body in bodies:
        assert source.startswith(body["prompt"]) and body["suffix"] in source and body["suffix"].strip()


class FakeEndpoint:
    """Answers every request at a server-specific pace: `speeds[server]` tokens/s after
    a TTFT of a millisecond per prompt character no cached prompt starts with: the
    cache keeps every prompt the server was sent, or with `one_slot` only the last (as
    a slot alone does). Records what each server was sent."""

    def __init__(self, speeds: dict[str, float], one_slot: bool = False):
        self.speeds, self.one_slot, self.sent, self.seen = speeds, one_slot, [], {}

    def __call__(self, server: Server, body: dict):
        self.sent.append((server.name, body))
        prompt = json.dumps(body.get("messages")) if "messages" in body else body["prompt"]
        seen = self.seen.setdefault(server.name, [])
        cached = max((next((i for i, (a, b) in enumerate(zip(prompt, old)) if a != b), min(len(prompt), len(old)))
                      for old in seen), default=0)
        seen[:] = [prompt] if self.one_slot else [*seen, prompt]
        ttft = 0.001 * (len(prompt) - cached) + 0.01
        tokens = 10
        answer = Reply("<<<<<<< SEARCH\nnothing\n=======\nx\n>>>>>>> REPLACE")
        return answer, {"ttft": ttft, "seconds": ttft + tokens / self.speeds[server.name],
                        "decode_seconds": (tokens - 1) / self.speeds[server.name], "prompt_tokens": len(prompt),
                        "cached_tokens": cached, "completion_tokens": tokens, "target_calls": 5, "drafted": 8,
                        "accepted": 5, "suffix_rounds": 0}


@pytest.mark.pure
def test_every_session_runs_on_every_server_in_rotating_order_with_the_same_turns():
    servers = [Server(n, f"http://{n}/v1", "m") for n in ("plain", "auto", "suffix")]
    fake = FakeEndpoint({"plain": 10.0, "auto": 20.0, "suffix": 30.0})
    sessions = make_sessions(["agent", "tools", "fim"], 1, 32)
    records = run_sessions(servers, sessions, 2, "greedy", send=fake, log=lambda msg: None)
    firsts = [name for name, body in fake.sent if body.get("max_tokens") == 32][::2]  # each session's first turn
    assert firsts == ["plain", "auto", "suffix", "auto", "suffix", "plain", "suffix", "plain", "auto"]
    turns = {}
    for name, body in fake.sent:
        turns.setdefault(name, []).append({k: v for k, v in body.items() if k != "model"})
    assert turns["plain"] == turns["auto"] == turns["suffix"]  # the same requests, whatever the server
    assert sum(r.side for r in records) == 3  # the tool session's side request before its second turn
    assert all(b["temperature"] == 0.0 for _, b in fake.sent)


@pytest.mark.pure
def test_the_summary_is_the_sums_of_the_turns_and_ratios_to_the_first_server():
    servers = [Server(n, f"http://{n}/v1", "m") for n in ("plain", "auto")]
    fake = FakeEndpoint({"plain": 10.0, "auto": 25.0})
    records = run_sessions(servers, make_sessions(["agent", "tools"], 2, 32), 3, "sample", send=fake,
                           log=lambda msg: None)
    rows = summarise(records)
    assert [(r["kind"], r["server"]) for r in rows] == [("agent", "plain"), ("agent", "auto"), ("tools", "plain"),
                                                        ("tools", "auto")]
    by = {(r["kind"], r["server"]): r for r in rows}
    agent = [t for t in records if t.kind == "agent" and t.server == "auto"]
    assert by["agent", "auto"]["tok_s"] == pytest.approx(sum(t.completion_tokens for t in agent) /
                                                         sum(t.seconds for t in agent))
    assert by["agent", "auto"]["decode_tok_s"] == pytest.approx(25.0)
    assert by["agent", "auto"]["before_first"] == pytest.approx(sum(t.ttft for t in agent) /
                                                                sum(t.seconds for t in agent))
    assert by["agent", "plain"]["x_tok_s"] == 1.0 and by["agent", "auto"]["x_decode"] == pytest.approx(2.5)
    assert by["agent", "auto"]["tokens_per_call"] == pytest.approx(2.0)
    assert by["agent", "auto"]["acceptance"] == pytest.approx(5 / 8)
    # An append-only conversation: later turns prefill only what was added since.
    assert by["tools", "auto"]["ttft_later_over_first_max"] < 0.5
    assert by["tools", "plain"]["sessions"] == 2 and by["tools", "plain"]["turns"] == 6  # side requests left out
    assert all(b["temperature"] == 0.8 for _, b in fake.sent if b["max_tokens"] == 32)
    assert len(table(rows)) == 2 + len(rows) and len(turn_table(records)) == 2 + 4 * 3


@pytest.mark.pure
def test_side_requests_come_between_the_tool_loops_turns():
    """Negative control of the TTFT figure: a cache of one slot, which each side request
    takes over, leaves the later turns' TTFT near the first's."""
    servers = [Server("one-slot", "http://a/v1", "m")]
    records = run_sessions(servers, make_sessions(["tools"], 1, 32), 3, "greedy",
                           send=FakeEndpoint({"one-slot": 10.0}, one_slot=True), log=lambda msg: None)
    assert [r.side for r in records] == [False, True, False, True, False]
    assert summarise(records)[0]["ttft_later_over_first_max"] > 0.9


@pytest.mark.pure
def test_a_failed_turn_is_recorded_and_the_session_goes_on():
    def failing(server, body):
        raise ConnectionError("refused")

    kept = []
    records = run_sessions([Server("a", "http://a/v1", "m")], make_sessions(["fim"], 1, 8), 2, "greedy",
                           send=failing, log=lambda msg: None, keep=lambda done: kept.append(len(done)))
    assert [r.error for r in records] == ["ConnectionError: refused"] * 2 and kept == [1, 2]
    assert summarise(records) == [] and isinstance(records[0], Turn)


class _ToolCalling(_Handler):
    """The bare endpoint, answering every chat request with one tool call streamed in
    pieces (its name first, then its arguments in two deltas), as OpenAI does, and a
    usage with our `speculative` extension."""

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.log.append((self.server.name, self.path, body))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        call = {"index": 0, "id": "c0", "type": "function", "function": {"name": "search_code", "arguments": ""}}
        for delta in ({"tool_calls": [call]}, {"tool_calls": [{"index": 0, "function": {"arguments": '{"pattern": '}}]},
                      {"tool_calls": [{"index": 0, "function": {"arguments": '"def quote"}'}}]}):
            self._send({"choices": [{"index": 0, "delta": delta}]}, True)
        self._send({"choices": [{"index": 0, "finish_reason": "tool_calls", "delta": {}}]}, True)
        self._send({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 7, "total_tokens": 16,
                                             "speculative": {"target_calls": 3, "drafted": 6, "accepted": 4,
                                                             "sources": {"suffix8": {"rounds": 2}}}}}, True)
        self.wfile.write(b"data: [DONE]\n\n")


@pytest.mark.system
def test_send_streams_text_tool_calls_and_usage_from_an_openai_endpoint():
    log = []
    plain, tools = OpenAIEndpoint("plain", log, words=5), OpenAIEndpoint("tools", log)
    tools.RequestHandlerClass = _ToolCalling
    with serving(plain, tools):
        server = Server("plain", plain.url + "/v1", "m")
        reply, measured = send(server, {"model": "m", "prompt": "def f(", "suffix": "\n", "max_tokens": 8})
        assert reply.text == " w0 w1 w2 w3 w4" and measured["completion_tokens"] == 5
        assert measured["ttft"] >= FIRST_TEXT_DELAY and measured["seconds"] >= measured["ttft"]
        assert measured["target_calls"] is None and measured["suffix_rounds"] is None  # an endpoint not ours
        assert log[-1][1] == "/v1/completions" and log[-1][2]["suffix"] == "\n" and log[-1][2]["stream"] is True
        session = ToolSession("quopri", 16)
        reply, measured = send(Server("tools", tools.url + "/v1", "m"), {"model": "m", **session.body()})
        assert reply.tool_calls == [("search_code", '{"pattern": "def quote"}')] and reply.text == ""
        assert measured["ttft"] is not None and (measured["target_calls"], measured["accepted"]) == (3, 4)
        assert measured["suffix_rounds"] == 2
        session.observe(reply)
        assert session.applied == [True] and session.messages[-1]["content"].startswith("quopri.py:")


@pytest.mark.system
def test_main_asks_the_endpoints_given_and_refuses_no_server_or_an_unknown_one(tmp_path, monkeypatch, capsys):
    from benchmarks import agents

    started = []
    monkeypatch.setattr(agents, "start_servers", lambda names, *a: started.append(names) or [])
    log = []
    with serving(OpenAIEndpoint("md", log, words=3)) as (md,):
        assert agents.main(["--out", str(tmp_path), "--kinds", "fim", "--sessions", "1", "--turns", "1",
                            "--url", f"md={md.url}"]) == 0
    assert started == [[]]  # --url alone: no server of ours started
    report = (tmp_path / "sessions-greedy-fim.md").read_text()
    assert "servers md" in report and [entry[1] for entry in log if entry[1] != "/v1/models"] == ["/v1/completions"]
    for argv, said in ((["--servers", "plain,bogus"], "--servers takes"), (["--servers", ""], "no server")):
        with pytest.raises(SystemExit):
            agents.main(["--out", str(tmp_path), *argv])
        assert said in capsys.readouterr().err
