"""Tool calls on the real pair (Qwen2.5-Coder, whose template shows Hermes-style calls),
end to end through the server, driven by the clients agents use: the official openai
client (a call, the same call streamed, a second turn with the tool's result) and
LangChain's ChatOpenAI (bind_tools and a tool loop; its last turn asks for text with
tool_choice none: under auto the 1.5B model calls the tool again). Greedy, with the
model drafter."""

import json

import jsonschema
import pytest

from serve_helpers import running

pytestmark = pytest.mark.real

WEATHER = {"type": "object", "properties": {"city": {"type": "string"},
                                            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The current weather in a city.",
                                           "parameters": WEATHER}}]
QUESTION = [{"role": "user", "content": "What is the weather in Paris right now, in celsius?"}]


@pytest.fixture(scope="module")
def url(real_pair):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    from specsample.app.assemble import Models
    from specsample.backends import load_backend
    from specsample.serve.app import create_app
    from specsample.serve.settings import Settings

    # Batch-invariant kernels: a prompt's rows are bitwise the same whether scored
    # fresh or after a start the slot's cache held (cache_prompt, the server's
    # default), so the same request streamed after it is whole gives the same call
    # token for token, and each later turn scores only what it adds to the one before
    # (its tools' few hundred tokens of schema once).
    target = load_backend(real_pair.target, "llamacpp", batch_invariant=True)
    models = Models(target, load_backend(real_pair.draft, "llamacpp"))
    settings = Settings(model_name="qwen", policy=3)
    app = create_app(target, models.drafter, models.drafter_name, settings)
    with running(app) as base:
        yield base


@pytest.fixture(scope="module")
def client(url):
    from openai import OpenAI

    return OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)


def test_the_openai_client_gets_a_call_streamed_or_not_then_an_answer_from_the_result(client):
    kw = dict(model="qwen", messages=QUESTION, tools=TOOLS, temperature=0, max_tokens=64)
    whole = client.chat.completions.create(**kw)
    assert whole.choices[0].finish_reason == "tool_calls"
    (call,) = whole.choices[0].message.tool_calls
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, WEATHER)
    assert call.function.name == "get_weather" and "paris" in arguments["city"].lower()
    assert whole.usage.model_dump()["speculative"]["forced_tokens"] > 0  # the call's layout came free

    parts = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    prompt = whole.usage.prompt_tokens  # streamed from the prompt the whole request left: its last token scored again
    assert parts[-1].usage.prompt_tokens_details.cached_tokens == prompt - 1
    opened = [p.choices[0].delta.tool_calls[0] for p in parts if p.choices and p.choices[0].delta.tool_calls
              and p.choices[0].delta.tool_calls[0].id]
    assert [(o.function.name, o.index) for o in opened] == [("get_weather", 0)]
    streamed = "".join(p.choices[0].delta.tool_calls[0].function.arguments or "" for p in parts
                       if p.choices and p.choices[0].delta.tool_calls)
    assert streamed == call.function.arguments and parts[-2].choices[0].finish_reason == "tool_calls"

    turn = [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 21, "sky": "clear"})}]
    answer = client.chat.completions.create(**{**kw, "messages": QUESTION + turn})
    assert answer.choices[0].message.tool_calls is None and "21" in answer.choices[0].message.content
    assert answer.usage.prompt_tokens_details.cached_tokens >= prompt  # the turn before it, not scored again


def test_langchain_binds_tools_and_runs_a_tool_loop(url):
    pytest.importorskip("langchain_openai", reason="langchain-openai is not installed")
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str, unit: str) -> str:
        """The current weather in a city; unit is celsius or fahrenheit."""
        return json.dumps({"city": city, "temperature": 21 if unit == "celsius" else 70, "sky": "clear"})

    model = ChatOpenAI(base_url=url + "/v1", api_key="unused", model="qwen", temperature=0, max_tokens=64,
                       max_retries=0, timeout=300).bind_tools([get_weather], tool_choice="required",
                                                                 parallel_tool_calls=False)
    messages = [HumanMessage(QUESTION[0]["content"])]
    reply = model.invoke(messages)
    (call,) = reply.tool_calls
    assert call["name"] == "get_weather" and "paris" in call["args"]["city"].lower()
    messages += [reply, ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])]
    final = ChatOpenAI(base_url=url + "/v1", api_key="unused", model="qwen", temperature=0, max_tokens=64,
                       max_retries=0, timeout=300).bind_tools([get_weather], tool_choice="none").invoke(messages)
    # A message, never a call. What it says is the 1.5B model's: on an AMD EPYC it wrote
    # the call again as text (the Qwen template shows calls as {{"name": ...}}), on an
    # Intel Xeon it answered with the tool's 21 degrees; in one run it wrote the call and
    # a made-up response as text to the 64-token limit. So the end is stop or length,
    # never tool_calls.
    assert not final.tool_calls and final.content.strip()
    assert final.response_metadata["finish_reason"] in ("stop", "length")


def test_qwens_tags_are_special_tokens_that_the_grammar_names_by_id(real_pair):
    """llguidance reads llama.cpp's user-defined <...> tokens as special: written as
    text in a grammar, <tool_call> could not be produced by the token Qwen writes."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    from specsample.output.constraints import start
    from specsample.output.tools import HERMES, Tool, special_markers, tool_constraint

    target = real_pair.shared("target")
    markers = special_markers(target, HERMES)
    assert set(markers) == {"<tool_call>", "</tool_call>"}
    required = start(tool_constraint([Tool("get_weather", WEATHER)], HERMES, "required", markers=markers), target, 64)
    assert required.forced()[0] == markers["<tool_call>"]
    auto = start(tool_constraint([Tool("get_weather", WEATHER)], HERMES, "auto", markers=markers), target, 64)
    spelled = [t for part in ("<", "tool", "_call", ">") for t in target.tokenizer.encode(part)]
    assert auto.accepts(markers["<tool_call>"]) and auto.accepted_prefix(spelled) == spelled[:-1]  # never spelled
