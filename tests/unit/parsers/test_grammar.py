"""JSON in grammars (parsers.grammar): objects hold only the keys their schema declares, in
structured output and in every tool family's forced call, unless the schema opens them."""

from __future__ import annotations

import json

import pytest

from tests.support.grammar import accepts, compile_error
from vllmmlxd.parsers.grammar import declared_only, json_grammar
from vllmmlxd.parsers.tools import TOOL_PARSERS, tool_parser_class

POINT = {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}, "required": ["x"]}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


def dumps(value) -> str:
    return json.dumps(value, separators=(", ", ": "))


def test_structured_output_writes_only_declared_keys():
    g = json_grammar(POINT)
    assert compile_error(g) is None
    assert accepts(g, dumps({"x": 1, "y": 2})) and accepts(g, dumps({"x": 1}))
    assert not accepts(g, dumps({"x": 1, "z": 3}))
    assert not accepts(g, dumps({"x": 1, '","': 3}))  # the key a random-weight model wandered into


def test_nested_objects_and_definitions_are_closed_too():
    schema = {
        "type": "object",
        "properties": {"at": {"$ref": "#/$defs/point"}, "all": {"type": "array", "items": {"$ref": "#/$defs/point"}}},
        "$defs": {"point": POINT},
    }
    g = json_grammar(schema)
    assert accepts(g, dumps({"at": {"x": 1}, "all": [{"x": 2, "y": 3}]}))
    assert not accepts(g, dumps({"at": {"x": 1, "w": 0}}))
    assert not accepts(g, dumps({"all": [{"x": 1, "w": 0}]}))


@pytest.mark.parametrize(
    "opened",
    [
        {"additionalProperties": True},
        {"additionalProperties": {"type": "integer"}},
        {"patternProperties": {"^z": {"type": "integer"}}},
    ],
)
def test_a_schema_that_opens_its_object_keeps_it_open(opened):
    assert accepts(json_grammar({**POINT, **opened}), dumps({"x": 1, "z": 3}))


def test_an_object_without_declared_properties_stays_free():
    assert accepts(json_grammar({"type": "object"}), dumps({"anything": 1}))  # json_object


def test_parts_of_a_combination_are_left_open():
    # Closing one part of allOf would refuse the keys the other part declares.
    schema = {
        "allOf": [
            {"type": "object", "properties": {"x": {"type": "integer"}}},
            {"type": "object", "properties": {"y": {"type": "integer"}}},
        ]
    }
    assert declared_only(schema) == schema


def test_the_schema_sent_is_not_changed():
    schema = json.loads(json.dumps(POINT))
    declared_only(schema)
    assert schema == POINT


@pytest.mark.parametrize("family", [f for f in TOOL_PARSERS if f != "auto"])
def test_a_forced_call_writes_only_declared_arguments(family):
    parser = tool_parser_class(family)
    g = parser.grammar(TOOLS)
    assert accepts(g, parser.render_call("get_weather", {"city": "Paris"}))
    assert not accepts(g, parser.render_call("get_weather", {"city": "Paris", '","': 1}))
