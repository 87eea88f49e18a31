"""Tool calls (tools.py): the format read from a chat template, the grammar for each
tool_choice, and the reader of calls, whole or streamed.

The distribution test: under tool_choice auto, text before a call is the target's
own. Its toy vocabulary has the trigger `<tool_call>` as one token (as Qwen's has),
so a call can start at any step. The statistic is an output up to LENGTH tokens cut
just after its first trigger (what follows is the grammar's, tested apart); its
exact distribution is the unconstrained target's, walked without any grammar. N =
1,500 outputs, Pearson chi-square, failing when p < toy.ALPHA = 1e-6, with the trigger as text and
as a special token (as llguidance reads llama.cpp's vocabularies). The negative control,
tool_choice none (which forbids the trigger), fails it with p < 1e-12 from CONTROL_N =
125 outputs (p ~ 1e-25; 3e-13 at 62): a test's power grows with its sample, so what
fails at 125 fails at 1,500.
"""

import json
import random

import jsonschema
import pytest

from specsample.decoding.drafters import ModelDrafter
from specsample.decoding.generate import GenerationConfig, generate
from specsample.decoding.sampling import SamplingConfig
from specsample.output.constraints import start
from specsample.output.tools import (HERMES, Arguments, CallStart, Content, Tool, ToolParser, parse_tool_calls,
                                     special_markers, tool_constraint, tool_format)

from toy import (TOOL_TEMPLATE, PieceTokenizer, TrigramBackend, byte_backend, assert_fits, assert_misfits, empirical,
                 exact_constrained_distribution, random_table)

pytestmark = pytest.mark.pure

WEATHER = Tool("get_weather", {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                                                "days": {"type": "integer", "minimum": 1,
                                                                         "maximum": 7}},
                               "required": ["city", "days"], "additionalProperties": False})
TIME = Tool("get_time", {"type": "object", "properties": {"tz": {"enum": ["utc", "cet"]}}, "required": ["tz"],
                         "additionalProperties": False})
SCHEMAS = {t.name: t.parameters for t in (WEATHER, TIME)}


# ---- the format, from the template ------------------------------------------------------

def test_the_format_is_read_from_the_template_never_assumed():
    assert tool_format(TOOL_TEMPLATE) is HERMES
    chatml = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    llama31 = "{% if tools %}{{ tools | tojson }}{% endif %}<|python_tag|>{{ messages[0].content }}"
    assert tool_format(chatml) is None and tool_format(llama31) is None and tool_format(None) is None


# ---- the reader --------------------------------------------------------------------------

OUTPUTS = [
    "Just text, with a <b>tag</b> and a trailing space ",
    'Let me look.\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "utc"}}\n</tool_call>',
    '<tool_call>\n{"name": "get_time", "arguments": {"tz": "utc"}}\n</tool_call>\n<tool_call>\n'
    '{"name": "get_weather", "arguments": {"city": "a}b", "days": 2}}\n</tool_call>\nDone <tool',
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par',  # cut off by max_tokens
    "a <tool_call> that never became a call",
    # Qwen2.5-Coder's own way: the body in a ```json block, a call when it names a tool.
    'Sure:\n```json\n{\n  "name": "get_time",\n  "arguments": {"tz": "cet"}\n}\n```\nDone.',
    '```json\n{\n  "name": "John", "age": 3\n}\n```',  # a JSON answer, not a call
    "```python\nprint(1)\n``` and ``",
]
NAMES = ("get_weather", "get_time")


@pytest.mark.parametrize("text", OUTPUTS)
def test_streamed_in_any_parts_the_reader_tells_what_the_whole_parse_does(text):
    content, calls = parse_tool_calls(text, HERMES, NAMES)
    rng = random.Random(0)
    for _ in range(30):
        parser, deltas, i = ToolParser(HERMES, NAMES), [], 0
        while i < len(text):
            n = rng.randint(1, 6)
            deltas += parser.feed(text[i:i + n])
            i += n
        deltas += parser.finish()
        assert "".join(d.text for d in deltas if isinstance(d, Content)) == content
        names = [d.name for d in deltas if isinstance(d, CallStart)]
        arguments = ["".join(d.text for d in deltas if isinstance(d, Arguments) and d.index == j)
                     for j in range(len(names))]
        assert [(c.name, c.arguments) for c in calls] == list(zip(names, arguments))


def test_the_reader_splits_content_from_calls():
    assert parse_tool_calls(OUTPUTS[0], HERMES) == (OUTPUTS[0], [])
    content, calls = parse_tool_calls(OUTPUTS[1], HERMES)
    assert content == "Let me look." and [(c.name, json.loads(c.arguments)) for c in calls] == [("get_time",
                                                                                                 {"tz": "utc"})]
    content, calls = parse_tool_calls(OUTPUTS[2], HERMES)
    assert content == "Done <tool" and [json.loads(c.arguments) for c in calls] == [{"tz": "utc"},
                                                                                  {"city": "a}b", "days": 2}]
    content, calls = parse_tool_calls(OUTPUTS[3], HERMES)
    assert content == "" and calls[0].arguments == '{"city": "Par'  # what was written, finish_reason length
    assert not calls[0].finished and all(c.finished for c in parse_tool_calls(OUTPUTS[2], HERMES)[1])
    assert parse_tool_calls(OUTPUTS[4], HERMES) == (OUTPUTS[4], [])
    content, calls = parse_tool_calls(OUTPUTS[5], HERMES, NAMES)
    assert content == "Sure:\nDone." and [(c.name, c.arguments, c.finished) for c in calls] == [
        ("get_time", '{"tz": "cet"}', True)]
    assert parse_tool_calls(OUTPUTS[5], HERMES) == (OUTPUTS[5], [])  # without the names, no fenced call
    assert parse_tool_calls(OUTPUTS[6], HERMES, NAMES) == (OUTPUTS[6], [])
    assert parse_tool_calls(OUTPUTS[7], HERMES, NAMES) == (OUTPUTS[7], [])


# ---- the grammar -------------------------------------------------------------------------

def accepts(constraint, text: str, backend) -> bool:
    state = start(constraint, backend, 1000)
    for token in backend.tokenizer.encode(text):
        if not state.accepts(token):
            return False
        state.advance(token)
    return True


def test_each_choice_allows_what_it_names():
    b = byte_backend(0)
    call = '<tool_call>\n{"name": "get_time", "arguments": {"tz": "utc"}}\n</tool_call>'
    two = call + "\n" + call
    fenced = '```json\n{\n  "name": "get_time", "arguments": {"tz": "utc"}\n}\n``` and text'
    cases = {  # choice, parallel -> (text, allowed)
        ("auto", True): [("any text", True), ("x" + call + " then text" + call, True),
                         ('<tool_call>\n{"name": "nope"', False), (call[:-20] + ', "x": 1}}', False),
                         (fenced, True), (fenced.replace("utc", "pst"), False),
                         ('```json\n{\n  "name": "John", "age": 3}\n```', True), ("```json\n[1, 2]\n```", True)],
        ("auto", False): [("any text", True), (call, True), (two, False)],
        ("required", True): [("any text", False), (two, True)],
        ("required", False): [(call, True), (two, False)],
        ("get_weather", True): [(call, False), ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "x", '
                                                '"days": 3}}\n</tool_call>', True)],
        ("none", True): [("any text", True), ("a <tool_call", True), ("a <tool_call>", False)],
    }
    for (choice, parallel), texts in cases.items():
        constraint = tool_constraint([WEATHER, TIME], HERMES, choice, parallel)
        for text, allowed in texts:
            assert accepts(constraint, text, b) == allowed, (choice, parallel, text)
    with pytest.raises(ValueError):
        tool_constraint([WEATHER], HERMES, "get_time")


@pytest.mark.parametrize("choice", ["required", "get_weather"])
def test_required_and_named_calls_validate_on_a_random_model(choice):
    """A random byte model writes nothing like JSON: the grammar alone makes every
    call parse and follow its schema, under speculation."""
    target, draft = byte_backend(0), byte_backend(1, "draft")
    constraint = tool_constraint([WEATHER, TIME], HERMES, choice, parallel=True)
    finished = 0
    for seed in range(6):
        sampling = SamplingConfig(1.0)
        result = generate(target, target.tokenizer.encode("call: "), GenerationConfig(
            max_new_tokens=120, sampling=sampling, seed=seed, constraint=constraint), ModelDrafter(draft, sampling), 3)
        content, calls = parse_tool_calls(result.text, HERMES)
        assert content == "" and calls
        if result.stop_reason == "length":
            calls = calls[:-1]  # the last one was cut off
        else:
            finished += 1
        for call in calls:
            assert choice == "required" or call.name == choice
            jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
    assert finished


def test_greedy_speculation_under_the_tool_grammar_equals_greedy_decoding():
    target, draft = byte_backend(0), byte_backend(1, "draft")
    constraint = tool_constraint([WEATHER, TIME], HERMES, "required")
    greedy = SamplingConfig(0.0)
    prompt = target.tokenizer.encode("call: ")
    config = GenerationConfig(max_new_tokens=60, sampling=greedy, constraint=constraint)
    plain = generate(target, prompt, config)
    speculative = generate(target, prompt, config, ModelDrafter(draft, greedy), 4)
    assert speculative.token_ids == plain.token_ids and speculative.stats.forced_tokens > 0


# ---- text before a call is the target's own ---------------------------------------------

PIECES = [b"a", b"b", b"<tool_call>", b"\n", b'{"name": "f", "arguments": ', b"{}", b"}", b"</tool_call>", b"<eos>"]
TRIGGER, CLOSE, EOS = 2, len(PIECES) - 2, len(PIECES) - 1
N, CONTROL_N, LENGTH = 1_500, 125, 3
PROMPT = [0, 1]


def toy(seed: int, name: str, special: bool = False) -> TrigramBackend:
    """special: the grammar engine holds <tool_call> and </tool_call> as special tokens,
    as it reads llama.cpp's vocabularies (the grammar then names them by id)."""
    b = TrigramBackend(random_table(len(PIECES), seed=seed), name=name)
    b.tokenizer = PieceTokenizer(PIECES, EOS, frozenset({TRIGGER, CLOSE}) if special else frozenset())
    b.eos_token_ids = frozenset({EOS})
    return b


def cut(tokens) -> tuple[int, ...]:
    tokens = tuple(tokens)
    return tokens[: tokens.index(TRIGGER) + 1] if TRIGGER in tokens else tokens


def exact_text(special: bool = False) -> dict[tuple[int, ...], float]:
    """The unconstrained target, walked until the trigger, the end token or LENGTH;
    a special closing tag outside a call is no text, as no special token is (but EOS)."""
    text = set(range(len(PIECES))) - ({CLOSE} if special else set())

    def allowed_after(tokens):
        return set() if tokens and tokens[-1] in (TRIGGER, EOS) else text

    return exact_constrained_distribution(toy(20, "target"), PROMPT, LENGTH, SamplingConfig(1.0), allowed_after)


def texts(choice: str, n: int = N, special: bool = False) -> dict[tuple[int, ...], int]:
    """n outputs under tool_choice `choice`, each cut after its first trigger."""
    target = toy(20, "target", special)
    markers = special_markers(target, HERMES)
    assert markers == ({"<tool_call>": TRIGGER, "</tool_call>": CLOSE} if special else {})
    constraint = tool_constraint([Tool("f")], HERMES, choice, markers=markers)
    sampling = SamplingConfig(1.0)
    config = GenerationConfig(max_new_tokens=LENGTH, sampling=sampling, constraint=constraint)
    return empirical(n, target, PROMPT, config, ModelDrafter(toy(21, "draft", special), sampling), 2, key=cut)


@pytest.mark.parametrize("special", [False, True])
def test_auto_leaves_the_text_before_a_call_to_the_target(special):
    exact = exact_text(special)
    assert exact[(TRIGGER,)] > 0.05  # calls do start here
    assert_fits(texts("auto", special=special), exact, N)


def test_negative_control_a_grammar_that_holds_text_back_fails():
    assert_misfits(texts("none", CONTROL_N), exact_text(), CONTROL_N, alpha=1e-12)


@pytest.mark.parametrize("special", [False, True])
def test_after_the_trigger_the_call_is_held(special):
    target = toy(20, "target", special)
    constraint = tool_constraint([Tool("f")], HERMES, "auto", markers=special_markers(target, HERMES))
    call = [TRIGGER, 3, 4, 5, 6, 3, CLOSE]  # <tool_call> \n {"name": "f", "arguments": {} } \n </tool_call>
    sampling, calls = SamplingConfig(1.0), 0
    for seed in range(100):
        tokens = generate(target, PROMPT, GenerationConfig(max_new_tokens=12, sampling=sampling, seed=seed,
                                                           constraint=constraint),
                          ModelDrafter(toy(21, "draft", special), sampling), 2).token_ids
        if TRIGGER in tokens:
            after = tokens[tokens.index(TRIGGER):]
            assert after[: len(call)] == call[: len(after)]
            calls += 1
    assert calls > 20


CUT_AFTER_A_CALL = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 1}}\n</tool_call>\n'
                    '<tool_call>\n{"name": "get_weather", "')  # max_tokens came inside a second call's head
CUT_AFTER_THE_BODY = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 1}}\n'


CUT_BETWEEN_CALLS = CUT_AFTER_THE_BODY + "</tool_call>\n"


@pytest.mark.parametrize("text", [CUT_AFTER_A_CALL, CUT_AFTER_THE_BODY, CUT_AFTER_THE_BODY + "</tool",
                                  CUT_BETWEEN_CALLS, CUT_BETWEEN_CALLS + "<tool_"])
def test_a_call_cut_off_by_max_tokens_leaves_no_markup_in_content_and_no_brace_in_arguments(text):
    """Both leaked: the second call's head came back as content, and a call whose
    closing tag was cut off kept its body's `}` (and the newline) in its arguments."""
    content, calls = parse_tool_calls(text, HERMES, NAMES)
    assert content == "" and [(c.name, c.arguments, c.finished) for c in calls] == [
        ("get_weather", '{"city": "Paris", "days": 1}', True)]


@pytest.mark.parametrize("stream", [False, True])
def test_an_answer_cut_inside_a_further_call_ends_in_tool_calls_with_the_whole_ones(stream):
    from specsample.decoding.generate import GenerationResult, GenerationStats
    from specsample.serve.replies import Choice, Reply

    between = Reply(True, "m", 5, None, tools=HERMES, tool_names=NAMES).whole(
        {0: Choice(0, CUT_BETWEEN_CALLS)}, {0: GenerationResult([], CUT_BETWEEN_CALLS, GenerationStats(), "length")})
    assert between["choices"][0]["finish_reason"] == "tool_calls"  # the greedy default pair's three calls in 64 tokens
    reply = Reply(True, "m", 5, None, tools=HERMES, tool_names=NAMES)
    results = {0: GenerationResult([], CUT_AFTER_A_CALL, GenerationStats(), "length")}
    if stream:
        chunks = reply.chunks(Choice(0, CUT_AFTER_A_CALL)) + reply.end_chunks(0, "length", results)
        deltas = [c["choices"][0]["delta"] for c in chunks]
        assert not any(d.get("content") for d in deltas)
        assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
        return
    (choice,) = reply.whole({0: Choice(0, CUT_AFTER_A_CALL)}, results)["choices"]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    assert [json.loads(c["function"]["arguments"]) for c in choice["message"]["tool_calls"]] == [
        {"city": "Paris", "days": 1}]
    # Cut inside the arguments: nothing to answer but what was written, as "length"
    results = {0: GenerationResult([], OUTPUTS[3], GenerationStats(), "length")}
    (choice,) = Reply(True, "m", 5, None, tools=HERMES).whole({0: Choice(0, OUTPUTS[3])}, results)["choices"]
    assert choice["finish_reason"] == "length" and "tool_call" not in (choice["message"]["content"] or "")
