"""The hermes grammar holds a forced call to its format and each tool's schema."""

from __future__ import annotations

from tests.support.grammar import accepts, compile_error
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
P = tool_parser_class("hermes")


def test_grammar_compiles_and_accepts_what_the_family_writes():
    g = P.grammar(TOOLS)
    assert compile_error(g) is None
    assert accepts(g, P.render_call("get_weather", {"city": "Paris", "days": 3}))
    assert accepts(g, P.render_call("get_time", {}) + "\n" + P.render_call("get_weather", {"city": "Oslo"}))


def test_grammar_refuses_what_the_schema_refuses():
    g = P.grammar(TOOLS)
    assert not accepts(g, P.render_call("get_weather", {"days": 3}))  # city is required
    assert not accepts(g, P.render_call("get_weather", {"city": "Paris", "days": 9}))  # out of bounds
    assert not accepts(g, P.render_call("rm_rf", {}))
    assert not accepts(g, "Sure! " + P.render_call("get_time", {}))


def test_one_call_only_unless_parallel():
    two = P.render_call("get_time", {}) + "\n" + P.render_call("get_time", {})
    assert not accepts(P.grammar(TOOLS, parallel=False), two)
