"""Llama calls, Llama 3 JSON and Llama 4 pythonic: golden texts split at every boundary, the grammar."""

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
    {
        "type": "function",
        "function": {
            "name": "search",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "filters": {"type": "object"},
                    "exact": {"type": "boolean"},
                },
            },
        },
    },
]
P = tool_parser_class("llama")

GOLDEN = {
    "bare json answer": (
        '{"name": "get_weather", "parameters": {"city": "Paris"}}',
        [call("get_weather", '{"city": "Paris"}')],
    ),
    "python tag call after text": (
        'Let me check.\n\n<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}',
        [("content", "Let me check.\n\n"), call("get_weather", '{"city": "Paris", "days": 2}')],
    ),
    "json calls joined by semicolons": (
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Lyon"}}; {"name": "get_time", "parameters": {}}',
        [call("get_weather", '{"city": "Lyon"}'), call("get_time", "{}")],
    ),
    "bare json after leading space, text after it": (
        '\n\n{"name": "get_time", "parameters": {}}\n\nChecking the time.',
        [("content", "\n\n"), call("get_time", "{}"), ("content", "\n\nChecking the time.")],
    ),
    "pythonic parallel calls": (
        '[get_weather(city="Paris", days=3), get_time()]',
        [call("get_weather", '{"city": "Paris", "days": 3}'), call("get_time", "{}")],
    ),
    "pythonic literals, json names, brackets in strings": (
        '[search(query=\'a ] b ) c \\\' "\', filters={"lang": "en", "tags": [1, 2]}, exact=true)]',
        [call("search", '{"query": "a ] b ) c \' \\"", "filters": {"lang": "en", "tags": [1, 2]}, "exact": true}')],
    ),
    "pythonic between python start and end": (
        '<|python_start|>[get_weather(city="Rome")]<|python_end|>',
        [call("get_weather", '{"city": "Rome"}')],
    ),
    "braces and markers inside json strings": (
        '{"name": "search", "parameters": {"query": "} ; {<|python_tag|>"}}',
        [call("search", '{"query": "} ; {<|python_tag|>"}')],
    ),
    "a pythonic call evaluates nothing": (
        '[search(query=__import__("os").getcwd())]',
        [("content", '[search(query=__import__("os").getcwd())]')],
    ),
    "a markdown answer starting with a bracket stays text": (
        "[1] See the docs: [link](https://example.com).",
        [("content", "[1] See the docs: [link](https://example.com).")],
    ),
    "a json answer that is no call stays text": (
        '{"answer": 42}\n',
        [("content", '{"answer": 42}\n')],
    ),
    "json mid-answer is text": (
        'The call is {"name": "get_time", "parameters": {}} here.',
        [("content", 'The call is {"name": "get_time", "parameters": {}} here.')],
    ),
    "malformed json stays text": (
        '<|python_tag|>{"name": "get_time", "parameters": {}',
        [("content", '<|python_tag|>{"name": "get_time", "parameters": {}')],
    ),
    "a built-in tool call after the tag stays text": (
        '<|python_tag|>brave_search.call(query="weather")',
        [("content", '<|python_tag|>brave_search.call(query="weather")')],
    ),
    "unknown tool stays text": (
        '[rm_rf(path="/")]',
        [("content", '[rm_rf(path="/")]')],
    ),
    "plain answer": ("It is sunny {mostly} [22 C].", [("content", "It is sunny {mostly} [22 C].")]),
}


@pytest.mark.parametrize("name", GOLDEN)
def test_golden_split_at_every_boundary(name):
    text, expected = GOLDEN[name]
    assert_splits_agree("llama", TOOLS, text, expected)


def test_arguments_key_also_read():
    assert run("llama", TOOLS, ['{"name": "get_time", "arguments": {}}']) == [call("get_time", "{}")]


def test_render_call_is_read_back():
    text = P.render_call("get_weather", {"city": "Rome"})
    assert text == '{"name": "get_weather", "parameters": {"city": "Rome"}}'
    assert run("llama", TOOLS, [text]) == [call("get_weather", '{"city": "Rome"}')]


def test_markers_are_the_special_tokens():
    assert P.markers == {"<|python_tag|>", "<|python_start|>", "<|python_end|>"}


def test_grammar_compiles_and_accepts_what_the_family_writes():
    g = P.grammar(TOOLS)
    assert compile_error(g) is None
    assert accepts(g, P.render_call("get_weather", {"city": "Paris", "days": 3}))
    assert accepts(g, P.render_call("get_time", {}) + "; " + P.render_call("get_weather", {"city": "Oslo"}))


def test_grammar_refuses_what_the_schema_refuses():
    g = P.grammar(TOOLS)
    assert not accepts(g, P.render_call("get_weather", {"days": 3}))
    assert not accepts(g, P.render_call("get_weather", {"city": "Paris", "days": 9}))
    assert not accepts(g, P.render_call("rm_rf", {}))
    assert not accepts(g, "Sure! " + P.render_call("get_time", {}))
    assert not accepts(
        P.grammar(TOOLS, parallel=False), P.render_call("get_time", {}) + "; " + P.render_call("get_time", {})
    )
