"""Llama-Nemotron calls: the golden texts whole and split at every boundary, malformed calls kept
as text, and the grammar."""

from __future__ import annotations

import pytest

from tests.support.grammar import accepts, compile_error
from tests.unit.parsers.tool_split import assert_splits_agree, call
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
P = tool_parser_class("nemotron")

GOLDEN = {
    "one call after text": (
        "I'll check the current weather in Paris.\n"
        '<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</TOOLCALL>',
        [("content", "I'll check the current weather in Paris.\n"), call("get_weather", '{"city": "Paris"}')],
    ),
    "parallel calls in one block": (
        '<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Lyon", "days": 2}}, '
        '{"name": "get_time", "arguments": {}}]</TOOLCALL>',
        [call("get_weather", '{"city": "Lyon", "days": 2}'), call("get_time", "{}")],
    ),
    "arguments as a JSON string": (
        '<TOOLCALL>[{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}]</TOOLCALL>',
        [call("get_weather", '{"city": "Oslo"}')],
    ),
    "two blocks, text after": (
        '<TOOLCALL>[{"name": "get_time", "arguments": {}}]</TOOLCALL>\n'
        '<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Rome"}}]</TOOLCALL> Done.',
        [call("get_time", "{}"), ("content", "\n"), call("get_weather", '{"city": "Rome"}'), ("content", " Done.")],
    ),
    "brackets and markers inside strings": (
        '<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "]} </TOOLCALL> <TOOLCALL>[{"}}]</TOOLCALL>',
        [call("get_weather", '{"city": "]} </TOOLCALL> <TOOLCALL>[{"}')],
    ),
    "no end marker before eos": (
        '<TOOLCALL>[{"name": "get_time", "arguments": {}}]',
        [call("get_time", "{}")],
    ),
    "unfinished json stays text": (
        'Sure. <TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Par',
        [("content", 'Sure. <TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Par')],
    ),
    "bad json stays text": (
        '<TOOLCALL>[{"name": "get_time", "arguments": {}},]</TOOLCALL> ok',
        [("content", '<TOOLCALL>[{"name": "get_time", "arguments": {}},]</TOOLCALL> ok')],
    ),
    "not json stays text": (
        "<TOOLCALL>get_time()</TOOLCALL>",
        [("content", "<TOOLCALL>get_time()</TOOLCALL>")],
    ),
    "unknown tool stays text": (
        '<TOOLCALL>[{"name": "rm_rf", "arguments": {"path": "/"}}]</TOOLCALL>',
        [("content", '<TOOLCALL>[{"name": "rm_rf", "arguments": {"path": "/"}}]</TOOLCALL>')],
    ),
    "plain answer": (
        "Open the <TOOLS> menu, then pick [Settings] {advanced}.",
        [("content", "Open the <TOOLS> menu, then pick [Settings] {advanced}.")],
    ),
}


@pytest.mark.parametrize("name", GOLDEN)
def test_golden_split_at_every_boundary(name):
    text, expected = GOLDEN[name]
    assert_splits_agree("nemotron", TOOLS, text, expected)


def test_render_call_is_read_back():
    text = P.render_call("get_weather", {"city": "Rome", "days": 2})
    assert_splits_agree("nemotron", TOOLS, text, [call("get_weather", '{"city": "Rome", "days": 2}')])


def test_markers_are_the_block_tags():
    assert P.markers == {"<TOOLCALL>", "</TOOLCALL>"}


def test_grammar_compiles_and_accepts_what_the_family_writes():
    g = P.grammar(TOOLS)
    assert compile_error(g) is None
    assert accepts(g, P.render_call("get_weather", {"city": "Paris", "days": 3}))
    assert accepts(
        g,
        '<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Lyon"}}, {"name": "get_time", "arguments": {}}]</TOOLCALL>',
    )


def test_grammar_refuses_what_the_schema_refuses():
    g = P.grammar(TOOLS)
    assert not accepts(g, P.render_call("get_weather", {"days": 3}))  # city is required
    assert not accepts(g, P.render_call("get_weather", {"city": "Paris", "days": 9}))  # out of bounds
    assert not accepts(g, P.render_call("rm_rf", {}))
    assert not accepts(g, "<TOOLCALL>[]</TOOLCALL>")
    assert not accepts(g, "Sure! " + P.render_call("get_time", {}))


def test_one_call_only_unless_parallel():
    g = P.grammar(TOOLS, parallel=False)
    assert accepts(g, P.render_call("get_time", {}))
    assert not accepts(
        g, '<TOOLCALL>[{"name": "get_time", "arguments": {}}, {"name": "get_time", "arguments": {}}]</TOOLCALL>'
    )
