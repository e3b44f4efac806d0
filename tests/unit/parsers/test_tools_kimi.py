"""Kimi K2 calls: golden texts split at every boundary, the grammar."""

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
P = tool_parser_class("kimi")

BEGIN, END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"


def one(name: str, index: int, args: str) -> str:
    return f"<|tool_call_begin|>functions.{name}:{index}<|tool_call_argument_begin|>{args}<|tool_call_end|>"


GOLDEN = {
    "one call after text": (
        "I'll check the weather in Paris." + BEGIN + one("get_weather", 0, '{"city": "Paris"}') + END,
        [("content", "I'll check the weather in Paris."), call("get_weather", '{"city": "Paris"}')],
    ),
    "parallel calls with newlines": (
        BEGIN
        + "\n"
        + one("get_weather", 0, '{"city": "Lyon", "days": 2}')
        + "\n"
        + one("get_time", 1, "{}")
        + "\n"
        + END,
        [call("get_weather", '{"city": "Lyon", "days": 2}'), call("get_time", "{}")],
    ),
    "text after the section stays content": (
        BEGIN + one("get_time", 3, "{}") + END + "\nOne moment.",
        [call("get_time", "{}"), ("content", "\nOne moment.")],
    ),
    "braces and markers inside strings": (
        BEGIN + one("get_weather", 0, '{"city": "} functions.x:1 {"}') + END,
        [call("get_weather", '{"city": "} functions.x:1 {"}')],
    ),
    "singular section markers": (
        "<|tool_call_section_begin|>" + one("get_time", 0, "{}") + "<|tool_call_section_end|>",
        [call("get_time", "{}")],
    ),
    "no section end before eos": (
        BEGIN + one("get_weather", 0, '{"city": "Rome"}'),
        [call("get_weather", '{"city": "Rome"}')],
    ),
    "cut off inside a call stays text": (
        BEGIN + '<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"ci',
        [("content", BEGIN + '<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"ci')],
    ),
    "malformed json stays text": (
        BEGIN + one("get_weather", 0, "{'city': 'Paris'") + END + " ok",
        [("content", BEGIN + one("get_weather", 0, "{'city': 'Paris'") + END + " ok")],
    ),
    "a header without its index stays text": (
        BEGIN + "<|tool_call_begin|>functions.get_time<|tool_call_argument_begin|>{}<|tool_call_end|>" + END,
        [
            (
                "content",
                BEGIN + "<|tool_call_begin|>functions.get_time<|tool_call_argument_begin|>{}<|tool_call_end|>" + END,
            )
        ],
    ),
    "unknown tool stays text": (
        BEGIN + one("rm_rf", 0, '{"path": "/"}') + END,
        [("content", BEGIN + one("rm_rf", 0, '{"path": "/"}') + END)],
    ),
    "plain answer": ("It is sunny <|> 22 C.", [("content", "It is sunny <|> 22 C.")]),
}


@pytest.mark.parametrize("name", GOLDEN)
def test_golden_split_at_every_boundary(name):
    text, expected = GOLDEN[name]
    assert_splits_agree("kimi", TOOLS, text, expected)


def test_render_call_is_read_back():
    text = P.render_call("get_weather", {"city": "Rome"})
    assert text == BEGIN + one("get_weather", 0, '{"city": "Rome"}') + END
    assert run("kimi", TOOLS, [text]) == [call("get_weather", '{"city": "Rome"}')]


def test_markers_hold_the_special_tokens():
    assert {BEGIN, END, "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"} <= P.markers


def test_grammar_compiles_and_accepts_what_the_family_writes():
    g = P.grammar(TOOLS)
    assert compile_error(g) is None
    assert accepts(g, P.render_call("get_weather", {"city": "Paris", "days": 3}))
    assert accepts(g, BEGIN + one("get_time", 0, "{}") + one("get_weather", 1, '{"city": "Oslo"}') + END)


def test_grammar_refuses_what_the_schema_refuses():
    g = P.grammar(TOOLS)
    assert not accepts(g, P.render_call("get_weather", {"days": 3}))
    assert not accepts(g, P.render_call("get_weather", {"city": "Paris", "days": 9}))
    assert not accepts(g, P.render_call("rm_rf", {}))
    assert not accepts(g, "Sure! " + P.render_call("get_time", {}))
    assert not accepts(P.grammar(TOOLS, parallel=False), BEGIN + one("get_time", 0, "{}") * 2 + END)
