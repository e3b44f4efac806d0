"""Qwen calls, hermes JSON and Qwen3-Coder XML: golden texts split at every boundary, the grammar."""

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
            "name": "write_file",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "content": {"type": "string"},
                    "overwrite": {"type": "boolean"},
                    "mode": {"type": "integer"},
                    "tags": {"type": "array"},
                    "ratio": {"type": "number"},
                },
            },
        },
    },
]
P = tool_parser_class("qwen")

GOLDEN = {
    "json call after text": (
        'Let me check the weather.\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        [("content", "Let me check the weather.\n\n"), call("get_weather", '{"city": "Paris"}')],
    ),
    "xml call after text": (
        "I'll look that up.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
        [("content", "I'll look that up.\n"), call("get_weather", '{"city": "San Francisco", "days": 3}')],
    ),
    "parallel calls, both forms": (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}}\n</tool_call>\n'
        "<tool_call>\n<function=get_time>\n</function>\n</tool_call>",
        [call("get_weather", '{"city": "Lyon"}'), ("content", "\n"), call("get_time", "{}")],
    ),
    "xml values typed by the schema, raw text kept": (
        "<tool_call>\n<function=write_file>\n<parameter=path>\n/tmp/a.py\n</parameter>\n"
        '<parameter=content>\ndef f():\n    return {"a": 1}  # </tool_call\n\n</parameter>\n'
        "<parameter=overwrite>\ntrue\n</parameter>\n<parameter=mode>\n644\n</parameter>\n"
        '<parameter=tags>\n["x", "y"]\n</parameter>\n<parameter=ratio>\n0.5\n</parameter>\n</function>\n</tool_call>',
        [
            call(
                "write_file",
                json.dumps(
                    {
                        "path": "/tmp/a.py",
                        "content": 'def f():\n    return {"a": 1}  # </tool_call\n',
                        "overwrite": True,
                        "mode": 644,
                        "tags": ["x", "y"],
                        "ratio": 0.5,
                    }
                ),
            )
        ],
    ),
    "a value that is not its type stays a string": (
        "<tool_call>\n<function=write_file>\n<parameter=mode>\nrw-r--r--\n</parameter>\n</function>\n</tool_call>",
        [call("write_file", '{"mode": "rw-r--r--"}')],
    ),
    "braces and tags inside json strings": (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "{<tool_call>} </tool_call"}}\n</tool_call>',
        [call("get_weather", '{"city": "{<tool_call>} </tool_call"}')],
    ),
    "no end tag before eos": (
        "<tool_call>\n<function=get_time>\n</function>\n",
        [call("get_time", "{}")],
    ),
    "xml cut off stays text": (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
        [("content", "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar")],
    ),
    "malformed json stays text": (
        'ok <tool_call>\n{"name": "get_time", "arguments": {</tool_call> done',
        [("content", 'ok <tool_call>\n{"name": "get_time", "arguments": {</tool_call> done')],
    ),
    "unknown tool stays text": (
        "<tool_call>\n<function=rm_rf>\n<parameter=path>\n/\n</parameter>\n</function>\n</tool_call>",
        [("content", "<tool_call>\n<function=rm_rf>\n<parameter=path>\n/\n</parameter>\n</function>\n</tool_call>")],
    ),
    "plain answer": ("It is sunny, <b>22</b> degrees.", [("content", "It is sunny, <b>22</b> degrees.")]),
}


@pytest.mark.parametrize("name", GOLDEN)
def test_golden_split_at_every_boundary(name):
    text, expected = GOLDEN[name]
    assert_splits_agree("qwen", TOOLS, text, expected)


def test_xml_without_tools_keeps_strings():
    text = "<tool_call>\n<function=f>\n<parameter=n>\n3\n</parameter>\n</function>\n</tool_call>"
    assert run("qwen", None, [text]) == [call("f", '{"n": "3"}')]


def test_render_call_is_read_back():
    assert run("qwen", TOOLS, [P.render_call("get_weather", {"city": "Rome"})]) == [
        call("get_weather", '{"city": "Rome"}')
    ]


def test_markers_are_the_tags():
    assert P.markers == {"<tool_call>", "</tool_call>"}


def test_grammar_is_hermes_and_holds_the_schema():
    g = P.grammar(TOOLS)
    assert compile_error(g) is None
    assert accepts(g, P.render_call("get_weather", {"city": "Paris", "days": 3}))
    assert accepts(g, P.render_call("get_time", {}) + "\n" + P.render_call("get_weather", {"city": "Oslo"}))
    assert not accepts(g, P.render_call("get_weather", {"city": "Paris", "days": 9}))
    assert not accepts(g, P.render_call("get_weather", {"days": 3}))
    assert not accepts(g, P.render_call("rm_rf", {}))
    assert not accepts(
        P.grammar(TOOLS, parallel=False), P.render_call("get_time", {}) + "\n" + P.render_call("get_time", {})
    )
