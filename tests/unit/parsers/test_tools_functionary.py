"""Functionary v3.2 (``>>>name`` segments) and v3.1 (``<function=name>``) calls: the golden texts
whole and split at every boundary, malformed calls kept as text, and the grammar."""

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
    {
        "type": "function",
        "function": {
            "name": "python",
            "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
        },
    },
]
P = tool_parser_class("functionary")

GOLDEN = {
    "v3.2: first segment, its >>> in the prompt": (
        'get_weather\n{"city": "Paris"}',
        [call("get_weather", '{"city": "Paris"}')],
    ),
    "v3.2: text, then a call": (
        'all\nLet me check the weather for you.>>>get_weather\n{"city": "Paris", "days": 2}',
        [("content", "Let me check the weather for you."), call("get_weather", '{"city": "Paris", "days": 2}')],
    ),
    "v3.2: parallel calls": (
        'get_weather\n{"city": "Lyon"}>>>get_time\n{}',
        [call("get_weather", '{"city": "Lyon"}'), call("get_time", "{}")],
    ),
    "v3.2: the model writes the first >>> too": (
        ">>>get_time\n{}\n>>>all\nOne moment.",
        [call("get_time", "{}"), ("content", "\nOne moment.")],
    ),
    "v3.2: python with raw code": (
        "python\nimport math\nprint(math.sqrt(2))\n>>>get_time\n{}",
        [call("python", '{"code": "import math\\nprint(math.sqrt(2))\\n"}'), call("get_time", "{}")],
    ),
    "v3.2: braces and markers inside strings": (
        'get_weather\n{"city": "}>>>all\\n{ <function=x>"}',
        [call("get_weather", '{"city": "}>>>all\\n{ <function=x>"}')],
    ),
    "v3.2: plain answer": (
        "all\nThe capital of France is Paris.",
        [("content", "The capital of France is Paris.")],
    ),
    "v3.2: plain answer without all": (
        "Paris\n\nIt is the capital of France; try >>> in Python's REPL.",
        [("content", "Paris\n\nIt is the capital of France; try >>> in Python's REPL.")],
    ),
    "v3.2: unfinished json stays text": (
        'all\nChecking.>>>get_weather\n{"city": "Par',
        [("content", 'Checking.>>>get_weather\n{"city": "Par')],
    ),
    "v3.2: bad json stays text": (
        'all\nChecking.>>>get_weather\n{"city": Paris} ok',
        [("content", 'Checking.>>>get_weather\n{"city": Paris} ok')],
    ),
    "v3.2: unknown tool stays text": (
        'rm_rf\n{"path": "/"}',
        [("content", 'rm_rf\n{"path": "/"}')],
    ),
    "v3.1: one call after text": (
        'Let me check.<function=get_weather>{"city": "Paris"}</function>',
        [("content", "Let me check."), call("get_weather", '{"city": "Paris"}')],
    ),
    "v3.1: parallel calls": (
        '<function=get_weather>{"city": "Lyon"}</function>\n<function=get_time>{}</function>',
        [call("get_weather", '{"city": "Lyon"}'), ("content", "\n"), call("get_time", "{}")],
    ),
    "v3.1: end tag inside a string": (
        '<function=get_weather>{"city": "</function>"}</function>',
        [call("get_weather", '{"city": "</function>"}')],
    ),
    "v3.1: no end tag before eos": (
        "<function=get_time>{}",
        [call("get_time", "{}")],
    ),
    "v3.1: bad name stays text": (
        "<function=get time>{}</function>",
        [("content", "<function=get time>{}</function>")],
    ),
    "v3.1: unknown tool stays text": (
        '<function=rm_rf>{"path": "/"}</function>',
        [("content", '<function=rm_rf>{"path": "/"}</function>')],
    ),
}


@pytest.mark.parametrize("name", GOLDEN)
def test_golden_split_at_every_boundary(name):
    text, expected = GOLDEN[name]
    assert_splits_agree("functionary", TOOLS, text, expected)


def test_render_call_is_read_back():
    text = P.render_call("get_weather", {"city": "Rome", "days": 2})
    assert_splits_agree("functionary", TOOLS, text, [call("get_weather", '{"city": "Rome", "days": 2}')])


def test_grammar_compiles_and_accepts_both_versions():
    g = P.grammar(TOOLS)
    assert compile_error(g) is None
    assert accepts(g, P.render_call("get_weather", {"city": "Paris", "days": 3}))
    assert accepts(g, 'get_weather\n{"city": "Lyon"}>>>get_time\n{}')  # first >>> in the prompt
    assert accepts(g, '<function=get_weather>{"city": "Lyon"}</function>\n<function=get_time>{}</function>')


def test_grammar_refuses_what_the_schema_refuses():
    g = P.grammar(TOOLS)
    assert not accepts(g, P.render_call("get_weather", {"days": 3}))  # city is required
    assert not accepts(g, P.render_call("get_weather", {"city": "Paris", "days": 9}))  # out of bounds
    assert not accepts(g, P.render_call("rm_rf", {}))
    assert not accepts(g, "<function=rm_rf>{}</function>")
    assert not accepts(g, "all\nSure! " + P.render_call("get_time", {}))


def test_one_call_only_unless_parallel():
    g = P.grammar(TOOLS, parallel=False)
    assert accepts(g, P.render_call("get_time", {}))
    assert not accepts(g, P.render_call("get_time", {}) + P.render_call("get_time", {}))
