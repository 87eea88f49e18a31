"""OpenAI's response_format through the server: JSON under a schema or any JSON
object, streamed or not, equal to the library's constrained output; bad formats get a
400 that names the field."""

import json

import httpx
import jsonschema
import pytest

from specsample.decoding.drafters import ModelDrafter
from specsample.decoding.generate import GenerationConfig, generate
from specsample.decoding.sampling import SamplingConfig
from specsample.output.constraints import Constraint

from serve_helpers import served_pair
from toy import byte_backend

pytestmark = pytest.mark.system

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 6}, "rainy": {"type": "boolean"},
                   "mm": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["city", "rainy", "mm"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "weather", "schema": SCHEMA, "strict": True}}
PROMPT = "weather today? "


@pytest.fixture(scope="module")
def served():
    with served_pair(byte_backend) as pair:
        yield pair


@pytest.fixture(scope="module")
def url(served):
    return served[0]


@pytest.fixture(scope="module")
def client(served):
    return served[1]


def direct(ids, constraint, seed, temperature=1.0, max_tokens=80):
    sampling = SamplingConfig(temperature)
    config = GenerationConfig(max_new_tokens=max_tokens, sampling=sampling, seed=seed, constraint=constraint)
    return generate(byte_backend(0), ids, config, ModelDrafter(byte_backend(1, "draft"), sampling), 3)


@pytest.mark.parametrize("seed,temperature", [(0, 1.0), (1, 0.0), (2, 0.7)])
def test_json_schema_completion_equals_library_streamed_or_not(client, seed, temperature):
    expected = direct(byte_backend(0).tokenizer.encode(PROMPT), Constraint.json_schema(SCHEMA, strict=True), seed,
                      temperature)
    kw = dict(model="toy", prompt=PROMPT, max_tokens=80, seed=seed, temperature=temperature,
              extra_body={"response_format": FORMAT})
    whole = client.completions.create(**kw)
    assert whole.choices[0].text == expected.text and whole.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(whole.choices[0].text), SCHEMA)
    assert whole.usage.model_dump()["speculative"]["forced_tokens"] == expected.stats.forced_tokens > 0
    streamed = "".join(c.choices[0].text for c in client.completions.create(**kw, stream=True))
    assert streamed == expected.text


def test_chat_json_schema_and_json_object_give_valid_json(client):
    """A random model may write an object longer than max_tokens: such an answer must
    be the library's own cut-off text with finish_reason "length"; a finished one must
    parse. At least one of the seeds finishes, so the parse is always checked."""
    messages = [{"role": "user", "content": "what is the weather?"}]
    ids = byte_backend(0).tokenizer.chat_messages(messages)
    finished = 0
    for seed in range(4):
        reply = client.chat.completions.create(model="toy", messages=messages, max_tokens=80, seed=seed,
                                               response_format=FORMAT)
        jsonschema.validate(json.loads(reply.choices[0].message.content), SCHEMA)
        chunks = list(client.chat.completions.create(model="toy", messages=messages, max_tokens=200, seed=seed,
                                                     response_format={"type": "json_object"}, stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        expected = direct(ids, Constraint.json_object(), seed, max_tokens=200)
        assert text == expected.text
        if expected.stop_reason == "grammar":
            assert reasons == ["stop"] and isinstance(json.loads(text), dict)
            finished += 1
        else:
            assert (expected.stop_reason, reasons) == ("length", ["length"])
    assert finished > 0


@pytest.mark.parametrize("response_format,param,words", [
    ({"type": "xml"}, "response_format.type", "json_schema"),
    ({"type": "json_schema"}, "response_format.json_schema", "required"),
    ({"type": "json_schema", "json_schema": {"schema": SCHEMA}}, "response_format.json_schema.name", "missing"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objec"}}},
     "response_format.json_schema.schema", "objec"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "format": "colour"},
                                             "strict": True}}, "response_format.json_schema.schema", "colour"),
    ({"type": "json_object", "colour": "red"}, "response_format.colour", "xtra"),
    ("json", "response_format", "ResponseFormat"),
])
def test_a_bad_response_format_is_a_400_naming_the_field(url, response_format, param, words):
    body = {"model": "toy", "prompt": "a", "max_tokens": 4, "response_format": response_format}
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"], error


def test_a_lenient_schema_is_served_and_names_what_it_left_unenforced(client, url):
    schema = {"type": "string", "format": "colour", "maxLength": 3}
    reply = client.completions.with_raw_response.create(
        model="toy", prompt="a", max_tokens=20,
        extra_body={"response_format": {"type": "json_schema",
                                        "json_schema": {"name": "x", "schema": schema, "strict": False}}})
    assert isinstance(json.loads(reply.parse().choices[0].text), str)
    assert "colour" in reply.headers["x-specsample-unenforced-schema"]
    unique = {"type": "json_schema", "json_schema": {"name": "x", "strict": False,
                                                     "schema": {"type": "array", "uniqueItems": True}}}
    body = {"model": "toy", "prompt": "a", "max_tokens": 8, "response_format": unique, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as r:
        assert r.status_code == 200 and "uniqueItems" in r.headers["x-specsample-unenforced-schema"]
    assert "x-specsample-unenforced-schema" not in httpx.post(
        f"{url}/v1/completions", json={**body, "stream": False, "response_format": FORMAT}, timeout=30).headers


def test_the_unenforced_header_carries_client_text_as_printable_ascii_only(url):
    """A schema's format name went back raw in the header: ESC, DEL and the like arrived as sent."""
    schema = {"type": "string", "format": "col\x1b[2Jour\x7f\u00e9", "maxLength": 3}
    body = {"model": "toy", "prompt": "a", "max_tokens": 8,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    header = r.headers["x-specsample-unenforced-schema"]
    assert all(" " <= c <= "~" for c in header), header
    assert "col\\x1b[2Jour\\x7f\\xe9" in header


def nested(depth):
    schema = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


@pytest.mark.parametrize("schema,strict,words", [
    ({"$ref": "#"}, True, "admits no output"), ({"$ref": "#"}, False, "admits no output"),
    (nested(200), True, "nested more than 128"),
    ({"type": "array", "items": {"not": {"type": "string"}}}, True, "not"),
])
def test_a_schema_the_server_cannot_honour_is_a_400(url, schema, strict, words):
    response_format = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": strict}}
    body = {"model": "toy", "prompt": "a", "max_tokens": 8, "response_format": response_format}
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
    assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
