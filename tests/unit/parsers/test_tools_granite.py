"""Granite calls, both generations: the golden texts whole and split at every boundary, malformed
calls kept as text, and the grammar."""

from __future__ import annotations

import pytest

from tests.support.grammar import accepts, compile_error
from tests.unit.parsers.tool_split import assert_splits_agree, call, run
from vllmmlxd.parsers.tools import tool_parser_class

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    },
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
]
P = tool_parser_class("granite")

GOLDEN = {
    "3.0: special token and an array, after text": (
        'Let me look that up.<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]',
        [("content", "Let me look that up."), call("get_weather", '{"city": "Paris"}')],
    ),
    "3.0: parallel calls in one array": (
        '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Lyon", "days": 2}}, {"name": "get_time", "arguments": {}}]',
        [call("get_weather", '{"city": "Lyon", "days": 2}'), call("get_time", "{}")],
    ),
    "3.1+: plain <tool_call> and an array, no end marker": (
        '<tool_call>[{"name": "get_time", "arguments": {}}]',
        [call("get_time", "{}")],
    ),
    "3.x: the call ends where its array closes": (
        '<|tool_call|>[{"name": "get_time", "arguments": {}}]\nOne moment.',
        [call("get_time", "{}"), ("content", "\nOne moment.")],
    ),
    "4.x: hermes-style block after text": (
        "I'll check the weather in Paris for you.\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        [("content", "I'll check the weather in Paris for you.\n"), call("get_weather", '{"city": "Paris"}')],
    ),
    "4.x: parallel blocks": (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
        [call("get_weather", '{"city": "Lyon"}'), ("content", "\n"), call("get_time", "{}")],
    ),
    "brackets and markers inside strings (3.x)": (
        '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "]} <|tool_call|>[{"}}]',
        [call("get_weather", '{"city": "]} <|tool_call|>[{"}')],
    ),
    "end marker inside a string (4.x)": (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "} </tool_call> {"}}\n</tool_call>',
        [call("get_weather", '{"city": "} </tool_call> {"}')],
    ),
    "4.x: no end marker before eos": (
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n',
        [call("get_time", "{}")],
    ),
    "unfinished array stays text": (
        'Checking. <|tool_call|>[{"name": "get_weather", "arguments": {"city": "Par',
        [("content", 'Checking. <|tool_call|>[{"name": "get_weather", "arguments": {"city": "Par')],
    ),
    "bad json stays text": (
        '<tool_call>\n{"name": "get_time" "arguments": {}}\n</tool_call> ok',
        [("content", '<tool_call>\n{"name": "get_time" "arguments": {}}\n</tool_call> ok')],
    ),
    "not json after the marker stays text": (
        '<|tool_call|>get_weather(city="Paris")',
        [("content", '<|tool_call|>get_weather(city="Paris")')],
    ),
    "unknown tool stays text": (
        '<|tool_call|>[{"name": "get_time", "arguments": {}}, {"name": "rm_rf", "arguments": {}}]',
        [("content", '<|tool_call|>[{"name": "get_time", "arguments": {}}, {"name": "rm_rf", "arguments": {}}]')],
    ),
    "plain answer": (
        "Paris is sunny today [22 °C] <3 {no rain}.",
        [("content", "Paris is sunny today [22 °C] <3 {no rain}.")],
    ),
}


@pytest.mark.parametrize("name", GOLDEN)
def test_golden_split_at_every_boundary(name):
    text, expected = GOLDEN[name]
    assert_splits_agree("granite", TOOLS, text, expected)


def test_arguments_given_as_json_text():
    text = '<|tool_call|>[{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}]'
    assert run("granite", TOOLS, [text]) == [call("get_weather", '{"city": "Oslo"}')]


def test_render_call_is_read_back():
    text = P.render_call("get_weather", {"city": "Rome", "days": 2})
    assert_splits_agree("granite", TOOLS, text, [call("get_weather", '{"city": "Rome", "days": 2}')])


def test_markers_are_the_special_tokens():
    assert "<|tool_call|>" in P.markers


def test_grammar_compiles_and_accepts_both_generations():
    g = P.grammar(TOOLS)
    assert compile_error(g) is None
    assert accepts(g, P.render_call("get_weather", {"city": "Paris", "days": 3}))
    assert accepts(g, P.render_call("get_time", {}) + "\n" + P.render_call("get_weather", {"city": "Oslo"}))
    assert accepts(
        g,
        '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Lyon"}}, {"name": "get_time", "arguments": {}}]',
    )


def test_grammar_refuses_what_the_schema_refuses():
    g = P.grammar(TOOLS)
    assert not accepts(g, P.render_call("get_weather", {"days": 3}))  # city is required
    assert not accepts(g, P.render_call("get_weather", {"city": "Paris", "days": 9}))  # out of bounds
    assert not accepts(g, P.render_call("rm_rf", {}))
    assert not accepts(g, '<|tool_call|>[{"name": "rm_rf", "arguments": {}}]')
    assert not accepts(g, "Sure! " + P.render_call("get_time", {}))


def test_one_call_only_unless_parallel():
    g = P.grammar(TOOLS, parallel=False)
    assert accepts(g, P.render_call("get_time", {}))
    assert not accepts(g, P.render_call("get_time", {}) + "\n" + P.render_call("get_time", {}))
    assert not accepts(g, '<|tool_call|>[{"name": "get_time", "arguments": {}}, {"name": "get_time", "arguments": {}}]')
