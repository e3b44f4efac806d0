"""Mistral calls, the JSON array and the v11 NAME[ARGS]{...} form: golden texts split at every boundary, the grammar."""

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
P = tool_parser_class("mistral")

GOLDEN = {
    "v11 call after text": (
        'Let me check.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
        [("content", "Let me check."), call("get_weather", '{"city": "Paris"}')],
    ),
    "v11 parallel calls": (
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Lyon", "days": 2}[TOOL_CALLS]get_time[ARGS]{}',
        [call("get_weather", '{"city": "Lyon", "days": 2}'), call("get_time", "{}")],
    ),
    "v11 call with a call id": (
        '[TOOL_CALLS]get_weather[CALL_ID]a1B2c3D4e[ARGS]{"city": "Oslo"}',
        [call("get_weather", '{"city": "Oslo"}')],
    ),
    "json array, parallel": (
        'Sure.[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Nice"}, "id": "Ab3dE5gH9"}, '
        '{"name": "get_time", "arguments": {}, "id": "Zx8yW7vU6"}]',
        [("content", "Sure."), call("get_weather", '{"city": "Nice"}'), call("get_time", "{}")],
    ),
    "text after the json closes stays content": (
        "[TOOL_CALLS]get_time[ARGS]{}\nDone.",
        [call("get_time", "{}"), ("content", "\nDone.")],
    ),
    "braces and markers inside strings": (
        '[TOOL_CALLS]get_weather[ARGS]{"city": "}] [TOOL_CALLS]x[ARGS]{"}',
        [call("get_weather", '{"city": "}] [TOOL_CALLS]x[ARGS]{"}')],
    ),
    "json cut off before eos stays text": (
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Par',
        [("content", '[TOOL_CALLS]get_weather[ARGS]{"city": "Par')],
    ),
    "malformed json stays text": (
        '[TOOL_CALLS]get_weather[ARGS]{"city": Paris} ok',
        [("content", '[TOOL_CALLS]get_weather[ARGS]{"city": Paris} ok')],
    ),
    "no header after the marker stays text": (
        "[TOOL_CALLS] I cannot call a tool for that.",
        [("content", "[TOOL_CALLS] I cannot call a tool for that.")],
    ),
    "unknown tool stays text": (
        '[TOOL_CALLS]rm_rf[ARGS]{"path": "/"}',
        [("content", '[TOOL_CALLS]rm_rf[ARGS]{"path": "/"}')],
    ),
    "plain answer": ("Use [brackets] and {braces} freely.", [("content", "Use [brackets] and {braces} freely.")]),
}


@pytest.mark.parametrize("name", GOLDEN)
def test_golden_split_at_every_boundary(name):
    text, expected = GOLDEN[name]
    assert_splits_agree("mistral", TOOLS, text, expected)


def test_arguments_written_as_a_json_string():
    text = '[TOOL_CALLS][{"name": "get_weather", "arguments": "{\\"city\\": \\"Bern\\"}"}]'
    assert run("mistral", TOOLS, [text]) == [call("get_weather", '{"city": "Bern"}')]


def test_render_call_is_read_back():
    assert P.render_call("get_weather", {"city": "Rome"}) == '[TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}'
    assert run("mistral", TOOLS, [P.render_call("get_weather", {"city": "Rome"})]) == [
        call("get_weather", '{"city": "Rome"}')
    ]


def test_markers_are_the_special_tokens():
    assert P.markers == {"[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"}


def test_grammar_compiles_and_accepts_what_the_family_writes():
    g = P.grammar(TOOLS)
    assert compile_error(g) is None
    assert accepts(g, P.render_call("get_weather", {"city": "Paris", "days": 3}))
    assert accepts(g, P.render_call("get_time", {}) + P.render_call("get_weather", {"city": "Oslo"}))


def test_grammar_refuses_what_the_schema_refuses():
    g = P.grammar(TOOLS)
    assert not accepts(g, P.render_call("get_weather", {"days": 3}))
    assert not accepts(g, P.render_call("get_weather", {"city": "Paris", "days": 9}))
    assert not accepts(g, P.render_call("rm_rf", {}))
    assert not accepts(g, "Sure! " + P.render_call("get_time", {}))
    assert not accepts(P.grammar(TOOLS, parallel=False), P.render_call("get_time", {}) * 2)
