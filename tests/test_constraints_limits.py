"""Schemas the engine cannot honour are refused with one line, never a crash or an
empty "valid" answer: too deep, admitting no output at all; and a lenient schema says
which of its keywords it left unenforced."""

import json

import pytest

from specsample.decoding.generate import GenerationConfig, stream
from specsample.output.constraints import Constraint, ConstraintError, start

from toy import byte_backend

pytestmark = pytest.mark.pure


def nested(depth: int) -> dict:
    schema = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


@pytest.mark.parametrize("depth", [480, 5000])
@pytest.mark.parametrize("as_text", [False, True])
def test_a_deeply_nested_schema_is_refused_in_one_line(depth, as_text):
    schema = nested(depth)
    if as_text:  # built by hand: json.dumps itself recurses
        schema = '{"type": "object", "properties": {"a": ' * depth + '{"type": "string"}' + "}}" * depth
    with pytest.raises(ConstraintError, match="nested more than 128 levels"):
        Constraint.json_schema(schema)


def test_a_schema_within_the_depth_limit_is_kept():
    assert Constraint.json_schema(nested(20)).grammar


@pytest.mark.parametrize("schema", [{"$ref": "#"}, {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}])
@pytest.mark.parametrize("strict", [True, False])
def test_a_schema_that_admits_nothing_is_refused_before_any_model_call(schema, strict):
    target = byte_backend(0)
    config = GenerationConfig(max_new_tokens=20, constraint=Constraint.json_schema(schema, strict=strict))
    with pytest.raises(ConstraintError, match="admits no output"):
        stream(target, target.tokenizer.encode("x"), config)


def test_a_schema_that_admits_something_starts():
    assert start(Constraint.json_schema({"type": "object"}), byte_backend(0), 20).length == 0


SCHEMA = {"type": "array", "uniqueItems": True, "items": {"not": {"type": "string"}}}


def test_lenient_mode_names_the_keywords_it_leaves_unenforced():
    lenient = Constraint.json_schema(SCHEMA, strict=False)
    assert any("uniqueItems" in w for w in lenient.unenforced) and any('"not"' in w for w in lenient.unenforced)
    assert Constraint.json_schema({"type": "array"}, strict=False).unenforced == ()
    with pytest.raises(ConstraintError, match='"not"'):
        Constraint.json_schema(json.dumps({"not": {"type": "string"}}), strict=True)
