"""GLM-4.5/4.6/4.7 calls (<arg_key>/<arg_value> pairs, values read by schema type): the golden
texts whole and split at every boundary, malformed calls kept as text, and the grammar."""

from __future__ import annotations

import json

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
                    "limit": {"type": "integer"},
                    "exact": {"type": "boolean"},
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "unit": {"type": "string", "enum": ["metric", "imperial"]},
                },
                "required": ["query"],
            },
        },
    },
]
P = tool_parser_class("glm47")

GOLDEN = {
    "4.5/4.6: one call after text": (
        "I'll check the weather in Paris for you.\n"
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
        "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
        [
            ("content", "I'll check the weather in Paris for you.\n"),
            call("get_weather", '{"city": "Paris", "days": 3}'),
        ],
    ),
    "4.7: no newlines": (
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>",
        [call("get_weather", '{"city": "Paris"}')],
    ),
    "parallel calls, one without arguments": (
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Lyon</arg_value>\n</tool_call>\n"
        "<tool_call>get_time\n</tool_call>",
        [call("get_weather", '{"city": "Lyon"}'), ("content", "\n"), call("get_time", "{}")],
    ),
    "values read by schema type": (
        "<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>007</arg_value>\n"
        '<arg_key>filters</arg_key>\n<arg_value>{"lang": "fr"}</arg_value>\n'
        "<arg_key>limit</arg_key>\n<arg_value>10</arg_value>\n"
        "<arg_key>exact</arg_key>\n<arg_value>true</arg_value>\n"
        '<arg_key>tags</arg_key>\n<arg_value>["a", "b"]</arg_value>\n</tool_call>',
        [call("search", '{"query": "007", "filters": {"lang": "fr"}, "limit": 10, "exact": true, "tags": ["a", "b"]}')],
    ),
    "a value that is not JSON stays a string": (
        "<tool_call>search<arg_key>query</arg_key><arg_value>x</arg_value>"
        "<arg_key>limit</arg_key><arg_value>ten</arg_value></tool_call>",
        [call("search", '{"query": "x", "limit": "ten"}')],
    ),
    "markers and braces inside a value": (
        "<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>a </tool_call> b {<tool_call>\n c</arg_value>\n</tool_call>",
        [call("search", '{"query": "a </tool_call> b {<tool_call>\\n c"}')],
    ),
    "hermes-style JSON inside the tags": (
        '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>',
        [call("get_time", "{}")],
    ),
    "no end marker before eos": (
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n",
        [call("get_weather", '{"city": "Paris"}')],
    ),
    "unfinished value stays text": (
        "Sure.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Par",
        [("content", "Sure.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Par")],
    ),
    "a key with no value stays text": (
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n</tool_call> ok",
        [("content", "<tool_call>get_weather\n<arg_key>city</arg_key>\n</tool_call> ok")],
    ),
    "a call that is not a name stays text": (
        "<tool_call>get_weather(city='Paris')</tool_call>",
        [("content", "<tool_call>get_weather(city='Paris')</tool_call>")],
    ),
    "unknown tool stays text": (
        "<tool_call>rm_rf\n<arg_key>path</arg_key>\n<arg_value>/</arg_value>\n</tool_call>",
        [("content", "<tool_call>rm_rf\n<arg_key>path</arg_key>\n<arg_value>/</arg_value>\n</tool_call>")],
    ),
    "plain answer": (
        "Use <tool> tags like <arg_key> in XML {freely}.",
        [("content", "Use <tool> tags like <arg_key> in XML {freely}.")],
    ),
}


@pytest.mark.parametrize("name", GOLDEN)
def test_golden_split_at_every_boundary(name):
    text, expected = GOLDEN[name]
    assert_splits_agree("glm47", TOOLS, text, expected)


def test_without_tools_every_value_is_a_string():
    text = "<tool_call>get_weather<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>"
    assert run("glm47", None, [text]) == [call("get_weather", '{"days": "3"}')]


def test_render_call_is_read_back():
    arguments = {"query": "a <b>", "filters": {"lang": "fr"}, "limit": 5, "exact": False, "unit": "metric"}
    text = P.render_call("search", arguments)
    assert_splits_agree("glm47", TOOLS, text, [call("search", json.dumps(arguments))])


def test_markers_are_the_special_tokens():
    assert P.markers == {"<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"}


def test_grammar_compiles_and_accepts_what_the_family_writes():
    g = P.grammar(TOOLS)
    assert compile_error(g) is None
    assert accepts(g, P.render_call("get_weather", {"city": "Paris", "days": 3}))
    assert accepts(
        g, P.render_call("search", {"query": "a </arg_key> <b>\n", "limit": 5, "tags": ["x"], "unit": "imperial"})
    )
    assert accepts(g, P.render_call("get_time", {}) + "\n" + P.render_call("get_weather", {"city": "Oslo"}))
    assert accepts(g, "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>")  # 4.7


def test_grammar_refuses_what_the_schema_refuses():
    g = P.grammar(TOOLS)
    assert not accepts(g, P.render_call("get_weather", {"days": 3}))  # city is required
    assert not accepts(g, P.render_call("get_weather", {"city": "Paris", "days": 9}))  # out of bounds
    assert not accepts(g, P.render_call("search", {"query": "x", "limit": "ten"}))
    assert not accepts(g, P.render_call("search", {"query": "x", "unit": "kelvin"}))
    assert not accepts(g, P.render_call("rm_rf", {}))
    assert not accepts(g, "Sure! " + P.render_call("get_time", {}))


def test_one_call_only_unless_parallel():
    g = P.grammar(TOOLS, parallel=False)
    assert accepts(g, P.render_call("get_time", {}))
    assert not accepts(g, P.render_call("get_time", {}) + "\n" + P.render_call("get_time", {}))
