"""xLAM calls: a bare JSON array as the answer, or fenced, or after [TOOL_CALLS], or in <tool_call>;
the golden texts whole and split at every boundary, non-calls kept as text, and the grammar."""

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
P = tool_parser_class("xlam")

GOLDEN = {
    "the answer is a call array": (
        '[{"name": "get_weather", "arguments": {"city": "Paris"}}]',
        [call("get_weather", '{"city": "Paris"}')],
    ),
    "parallel calls, space before": (
        '\n[{"name": "get_weather", "arguments": {"city": "Lyon", "days": 2}}, {"name": "get_time", "arguments": {}}]',
        [("content", "\n"), call("get_weather", '{"city": "Lyon", "days": 2}'), call("get_time", "{}")],
    ),
    "fenced block after text": (
        'I will look up the weather.\n```json\n[{"name": "get_weather", "arguments": {"city": "Paris"}}]\n```',
        [("content", "I will look up the weather.\n"), call("get_weather", '{"city": "Paris"}')],
    ),
    "after [TOOL_CALLS]": (
        '[TOOL_CALLS][{"name": "get_time", "arguments": {}}]',
        [call("get_time", "{}")],
    ),
    "[TOOL_CALLS] after text": (
        'Checking. [TOOL_CALLS] [{"name": "get_time", "arguments": {}}]',
        [("content", "Checking. "), call("get_time", "{}")],
    ),
    "within <tool_call> tags": (
        '<tool_call>\n[{"name": "get_weather", "arguments": {"city": "Oslo"}}]\n</tool_call>',
        [call("get_weather", '{"city": "Oslo"}')],
    ),
    "brackets and markers inside strings": (
        '[{"name": "get_weather", "arguments": {"city": "]} ``` [TOOL_CALLS] </tool_call> [{"}}]',
        [call("get_weather", '{"city": "]} ``` [TOOL_CALLS] </tool_call> [{"}')],
    ),
    "text after the array stays content": (
        '[{"name": "get_time", "arguments": {}}]\nLet me know if you need more.',
        [call("get_time", "{}"), ("content", "\nLet me know if you need more.")],
    ),
    "fenced block with no closing fence before eos": (
        '```json\n[{"name": "get_time", "arguments": {}}]\n',
        [call("get_time", "{}")],
    ),
    "unfinished array stays text": (
        '[{"name": "get_weather", "arguments": {"city": "Par',
        [("content", '[{"name": "get_weather", "arguments": {"city": "Par')],
    ),
    "bad json stays text": (
        '[{"name": "get_time", "arguments": {}},]',
        [("content", '[{"name": "get_time", "arguments": {}},]')],
    ),
    "json that is not calls stays text": (
        'Here it is:\n```json\n[{"city": "Paris", "temp": 21}]\n```\nAnything else?',
        [("content", 'Here it is:\n```json\n[{"city": "Paris", "temp": 21}]\n```\nAnything else?')],
    ),
    "unknown tool stays text": (
        '[{"name": "rm_rf", "arguments": {"path": "/"}}]',
        [("content", '[{"name": "rm_rf", "arguments": {"path": "/"}}]')],
    ),
    "an answer that starts with a bracket": (
        "[1] Smith et al. report 21 °C in Paris.",
        [("content", "[1] Smith et al. report 21 °C in Paris.")],
    ),
    "an array later in the answer is not a call": (
        'You could call [{"name": "get_time", "arguments": {}}] yourself.',
        [("content", 'You could call [{"name": "get_time", "arguments": {}}] yourself.')],
    ),
    "plain answer with a code block": (
        "Use this:\n```python\nprint({'a': [1]})\n```",
        [("content", "Use this:\n```python\nprint({'a': [1]})\n```")],
    ),
}


@pytest.mark.parametrize("name", GOLDEN)
def test_golden_split_at_every_boundary(name):
    text, expected = GOLDEN[name]
    assert_splits_agree("xlam", TOOLS, text, expected)


def test_render_call_is_read_back():
    text = P.render_call("get_weather", {"city": "Rome", "days": 2})
    assert_splits_agree("xlam", TOOLS, text, [call("get_weather", '{"city": "Rome", "days": 2}')])


def test_grammar_compiles_and_accepts_what_the_family_writes():
    g = P.grammar(TOOLS)
    assert compile_error(g) is None
    assert accepts(g, P.render_call("get_weather", {"city": "Paris", "days": 3}))
    assert accepts(g, '[{"name": "get_weather", "arguments": {"city": "Lyon"}}, {"name": "get_time", "arguments": {}}]')


def test_grammar_refuses_what_the_schema_refuses():
    g = P.grammar(TOOLS)
    assert not accepts(g, P.render_call("get_weather", {"days": 3}))  # city is required
    assert not accepts(g, P.render_call("get_weather", {"city": "Paris", "days": 9}))  # out of bounds
    assert not accepts(g, P.render_call("rm_rf", {}))
    assert not accepts(g, "[]")
    assert not accepts(g, "Sure! " + P.render_call("get_time", {}))


def test_one_call_only_unless_parallel():
    g = P.grammar(TOOLS, parallel=False)
    assert accepts(g, P.render_call("get_time", {}))
    assert not accepts(g, '[{"name": "get_time", "arguments": {}}, {"name": "get_time", "arguments": {}}]')
