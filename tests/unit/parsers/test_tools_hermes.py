"""Hermes calls: the golden texts whole and split at every boundary, malformed calls kept as text."""

from __future__ import annotations

import json

import pytest

from tests.unit.parsers.tool_split import assert_splits_agree, call, run
from vllmmlxd.parsers.tools import tool_parser_class

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    },
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
]

GOLDEN = {
    "one call after text": (
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        [("content", "Let me check.\n"), call("get_weather", '{"city": "Paris"}')],
    ),
    "parallel calls": (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
        [call("get_weather", '{"city": "Lyon"}'), ("content", "\n"), call("get_time", "{}")],
    ),
    "braces and tags inside strings": (
        '<tool_call>{"name": "get_weather", "arguments": {"city": "} </tool_call"}}</tool_call>',
        [call("get_weather", '{"city": "} </tool_call"}')],
    ),
    "no end tag before eos": (
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n',
        [call("get_time", "{}")],
    ),
    "malformed json stays text": (
        'ok <tool_call>\n{"name": "get_time", "arguments": {</tool_call> done',
        [("content", 'ok <tool_call>\n{"name": "get_time", "arguments": {</tool_call> done')],
    ),
    "unknown tool stays text": (
        '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>',
        [("content", '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>')],
    ),
    "plain answer": ("It is sunny < 30 degrees.", [("content", "It is sunny < 30 degrees.")]),
}


@pytest.mark.parametrize("name", GOLDEN)
def test_golden_split_at_every_boundary(name):
    text, expected = GOLDEN[name]
    assert_splits_agree("hermes", TOOLS, text, expected)


def test_arguments_are_a_json_object_text():
    [(_, got)] = run(
        "hermes", TOOLS, ['<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}</tool_call>']
    )
    assert json.loads(got.arguments) == {"city": "Oslo"}


def test_render_call_is_read_back():
    cls = tool_parser_class("hermes")
    assert run("hermes", TOOLS, [cls.render_call("get_weather", {"city": "Rome"})]) == [
        call("get_weather", '{"city": "Rome"}')
    ]
