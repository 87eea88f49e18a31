"""Tool calls through the server (tools, tool_choice, parallel_tool_calls, tool turns),
driven by the official openai client: whole and streamed answers tell the same calls,
equal to the library's constrained output, and every argument validates; requests
the server cannot honour get a 400 that names the field."""

import json

import httpx
import jsonschema
import pytest

from specsample.decoding.drafters import ModelDrafter
from specsample.decoding.generate import GenerationConfig, generate
from specsample.decoding.sampling import SamplingConfig
from specsample.output.tools import HERMES, Tool, parse_tool_calls, tool_constraint

from serve_helpers import running, served_pair, toy_app
from toy import tool_backend

pytestmark = pytest.mark.system

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"tz": {"enum": ["utc", "cet"]}}, "required": ["tz"],
        "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "the forecast", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
MESSAGES = [{"role": "user", "content": "what is the weather?"}]


@pytest.fixture(scope="module")
def served():
    with served_pair(tool_backend) as pair:
        yield pair


@pytest.fixture(scope="module")
def url(served):
    return served[0]


@pytest.fixture(scope="module")
def client(served):
    return served[1]


def library(choice, seed, parallel=True, max_tokens=120):
    target = tool_backend(0)
    tools = [Tool(t["function"]["name"], t["function"]["parameters"]) for t in TOOLS]
    sampling = SamplingConfig(1.0)
    config = GenerationConfig(max_new_tokens=max_tokens, sampling=sampling, seed=seed,
                              constraint=tool_constraint(tools, HERMES, choice, parallel))
    ids = target.tokenizer.chat_messages(MESSAGES, TOOLS)
    return generate(target, ids, config, ModelDrafter(tool_backend(1, "draft"), sampling), 3)


def streamed_calls(chunks):
    """The calls a stream tells, put together as a client does: by index."""
    calls, content, finish = {}, "", None
    for chunk in chunks:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for part in delta.tool_calls or []:
            if part.id is not None:
                assert part.index not in calls and part.type == "function"
                calls[part.index] = {"id": part.id, "name": part.function.name, "arguments": ""}
            calls[part.index]["arguments"] += part.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish


@pytest.mark.parametrize("choice,seed", [("required", 0), ("required", 3), ("get_time", 1)])
def test_required_and_named_calls_stream_as_they_answer_whole_and_validate(client, choice, seed):
    tool_choice = choice if choice == "required" else {"type": "function", "function": {"name": choice}}
    kw = dict(model="toy", messages=MESSAGES, tools=TOOLS, tool_choice=tool_choice, max_tokens=120, seed=seed)
    expected = library(choice, seed)
    whole = client.chat.completions.create(**kw)
    message = whole.choices[0].message
    _, calls = parse_tool_calls(expected.text, HERMES)
    whole_calls = [c for c in calls if c.finished]  # a call max_tokens cut off is left out of the whole answer
    assert [(c.function.name, c.function.arguments) for c in message.tool_calls or []] == \
        [(c.name, c.arguments) for c in whole_calls]
    assert whole.choices[0].finish_reason == ("tool_calls" if whole_calls else "length")
    assert not message.content
    for call in message.tool_calls or []:
        assert choice == "required" or call.function.name == choice
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    assert len({c.id for c in message.tool_calls or []}) == len(whole_calls)
    content, streamed, finish = streamed_calls(client.chat.completions.create(**kw, stream=True))
    # Streamed, a cut-off call's arguments went out before the cut: the stream ends as "length".
    assert content == "" and finish == ("tool_calls" if calls and calls[-1].finished else "length")
    assert [(c["name"], c["arguments"]) for c in streamed] == [(c.name, c.arguments) for c in calls]
    assert whole.usage.model_dump()["speculative"]["forced_tokens"] > 0


def test_one_call_at_most_without_parallel_calls(client):
    for seed in range(3):
        reply = client.chat.completions.create(model="toy", messages=MESSAGES, tools=TOOLS, tool_choice="required",
                                               parallel_tool_calls=False, max_tokens=120, seed=seed)
        assert len(reply.choices[0].message.tool_calls) == 1
        assert parse_tool_calls(library("required", seed, parallel=False).text, HERMES)[1][0].arguments == \
            reply.choices[0].message.tool_calls[0].function.arguments


@pytest.mark.parametrize("choice", ["auto", "none"])
def test_a_text_answer_is_content_as_the_library_writes_it(client, choice):
    """The random model never writes the trigger in 40 tokens: auto and none answer in
    text, the same text streamed or not."""
    kw = dict(model="toy", messages=MESSAGES, tools=TOOLS, tool_choice=choice, max_tokens=40, seed=5)
    whole = client.chat.completions.create(**kw)
    assert whole.choices[0].message.tool_calls is None and whole.choices[0].finish_reason == "length"
    assert whole.choices[0].message.content == library(choice, 5, max_tokens=40).text
    content, calls, finish = streamed_calls(client.chat.completions.create(**kw, stream=True))
    assert content == whole.choices[0].message.content and calls == [] and finish == "length"


def test_a_tool_turn_goes_back_into_the_template(client, url):
    call = {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": '{"tz": "utc"}'}}
    messages = MESSAGES + [{"role": "assistant", "content": None, "tool_calls": [call]},
                           {"role": "tool", "tool_call_id": "call_1", "content": "12:00"}]
    ids = httpx.post(f"{url}/tokenize", json={"messages": messages, "tools": TOOLS}).json()["tokens"]
    text = tool_backend(0).tokenizer.decode(ids)
    assert '"name": "get_time", "description"' not in text  # tools are written with their keys in order
    assert '{"type": "function", "function": {"name": "get_weather", "description": "the forecast"' in text
    assert 'assistant: <tool_call>\n{"name": "get_time", "arguments": {"tz": "utc"}}\n</tool_call>\ntool: 12:00\n' \
        in text
    reply = client.chat.completions.create(model="toy", messages=messages, tools=TOOLS, max_tokens=8, seed=1)
    assert reply.choices[0].finish_reason in ("length", "stop", "tool_calls")


def post(url, **body):
    return httpx.post(f"{url}/v1/chat/completions", json={"model": "toy", "messages": MESSAGES, "max_tokens": 4,
                                                          **body})


@pytest.mark.parametrize("body,param", [
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": TOOLS, "response_format": {"type": "json_object"}}, "response_format"),
    ({"tools": TOOLS + TOOLS[:1]}, "tools"),
    ({"tools": [TOOLS[0], {"type": "function", "function": {"name": "f", "parameters": {"type": "objec"}}}]},
     "tools[1].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
     "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools.0.function.name"),
    ({"messages": MESSAGES + [{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "get_time", "arguments": "{tz"}}]}]},
     "messages[1].tool_calls[0].function.arguments"),
    ({"messages": MESSAGES + [{"role": "tool", "tool_call_id": "c"}]}, "messages.1.content"),
    ({"messages": [{"role": "user", "content": "hi", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]}]}, "messages.0"),
])
def test_requests_that_cannot_be_honoured_get_a_400_naming_the_field(url, body, param):
    response = post(url, **body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_a_model_whose_template_shows_no_tool_format_refuses_tools():
    app, _ = toy_app()
    with running(app) as base:
        response = post(base, tools=TOOLS)
        neutral = post(base, tools=[], tool_choice="none")
    assert response.status_code == 400 and response.json()["error"]["code"] == "tools_unsupported"
    assert "<tool_call>" in response.json()["error"]["message"]
    assert neutral.status_code == 200  # no tools asks for nothing
