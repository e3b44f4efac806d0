"""DeepSeek calls, the V3 / R1 fenced form and the V3.1 form: golden texts split at every boundary, the grammar."""

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
P = tool_parser_class("deepseek")

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
BEGIN, END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"


def v3(name: str, args: str) -> str:
    return f"{BEGIN}function{SEP}{name}\n```json\n{args}\n```{END}"


def v31(name: str, args: str) -> str:
    return f"{BEGIN}{name}{SEP}{args}{END}"


GOLDEN = {
    "v3 call after text": (
        "Let me check the weather.\n\n" + CALLS_BEGIN + v3("get_weather", '{"city": "Paris"}') + CALLS_END,
        [("content", "Let me check the weather.\n\n"), call("get_weather", '{"city": "Paris"}')],
    ),
    "v3 parallel calls": (
        CALLS_BEGIN + v3("get_weather", '{"city": "Lyon", "days": 2}') + "\n" + v3("get_time", "{}") + CALLS_END,
        [call("get_weather", '{"city": "Lyon", "days": 2}'), call("get_time", "{}")],
    ),
    "v3.1 parallel calls after text": (
        "Checking." + CALLS_BEGIN + v31("get_weather", '{"city": "Oslo"}') + v31("get_time", "{}") + CALLS_END,
        [("content", "Checking."), call("get_weather", '{"city": "Oslo"}'), call("get_time", "{}")],
    ),
    "a call without its section": (
        v31("get_time", "{}") + "\nDone.",
        [call("get_time", "{}"), ("content", "\nDone.")],
    ),
    "braces, fences and text inside strings": (
        CALLS_BEGIN + v3("get_weather", '{"city": "} ```json { <tool_call>"}') + CALLS_END,
        [call("get_weather", '{"city": "} ```json { <tool_call>"}')],
    ),
    "no section end before eos": (
        CALLS_BEGIN + v31("get_weather", '{"city": "Rome"}'),
        [call("get_weather", '{"city": "Rome"}')],
    ),
    "cut off inside a call stays text": (
        CALLS_BEGIN + BEGIN + "get_weather" + SEP + '{"city": "Ro',
        [("content", CALLS_BEGIN + BEGIN + "get_weather" + SEP + '{"city": "Ro')],
    ),
    "malformed json stays text": (
        CALLS_BEGIN + v3("get_weather", "{city: Paris}") + CALLS_END + " ok",
        [("content", CALLS_BEGIN + v3("get_weather", "{city: Paris}") + CALLS_END + " ok")],
    ),
    "unknown tool stays text": (
        CALLS_BEGIN + v31("rm_rf", '{"path": "/"}') + CALLS_END,
        [("content", CALLS_BEGIN + v31("rm_rf", '{"path": "/"}') + CALLS_END)],
    ),
    "plain answer": ("It is sunny | 22 C.", [("content", "It is sunny | 22 C.")]),
}


@pytest.mark.parametrize("name", GOLDEN)
def test_golden_split_at_every_boundary(name):
    text, expected = GOLDEN[name]
    assert_splits_agree("deepseek", TOOLS, text, expected)


def test_render_call_is_read_back():
    text = P.render_call("get_weather", {"city": "Rome"})
    assert text == CALLS_BEGIN + v3("get_weather", '{"city": "Rome"}') + CALLS_END
    assert run("deepseek", TOOLS, [text]) == [call("get_weather", '{"city": "Rome"}')]


def test_markers_are_the_special_tokens():
    assert P.markers == {CALLS_BEGIN, CALLS_END, BEGIN, END, SEP}


def test_grammar_compiles_and_accepts_what_the_family_writes():
    g = P.grammar(TOOLS)
    assert compile_error(g) is None
    assert accepts(g, P.render_call("get_weather", {"city": "Paris", "days": 3}))
    assert accepts(g, CALLS_BEGIN + v3("get_time", "{}") + v3("get_weather", '{"city": "Oslo"}') + CALLS_END)


def test_grammar_refuses_what_the_schema_refuses():
    g = P.grammar(TOOLS)
    assert not accepts(g, P.render_call("get_weather", {"days": 3}))
    assert not accepts(g, P.render_call("get_weather", {"city": "Paris", "days": 9}))
    assert not accepts(g, P.render_call("rm_rf", {}))
    assert not accepts(g, "Sure! " + P.render_call("get_time", {}))
    two = CALLS_BEGIN + v3("get_time", "{}") * 2 + CALLS_END
    assert not accepts(P.grammar(TOOLS, parallel=False), two)
