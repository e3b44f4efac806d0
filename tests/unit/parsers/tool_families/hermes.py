"""Hermes: a JSON call in <tool_call> tags."""

from __future__ import annotations

from tests.unit.parsers.tool_families.spec import Family
from tests.unit.parsers.tool_split import call
from vllmmlxd.parsers.tools import tool_parser_class

P = tool_parser_class("hermes")

FAMILY = Family(
    name="hermes",
    calls={
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
        "arguments written as a JSON string": (
            '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}</tool_call>',
            [call("get_weather", '{"city": "Oslo"}')],
        ),
    },
    plain={"plain answer": "It is sunny < 30 degrees."},
    malformed={"malformed json stays text": 'ok <tool_call>\n{"name": "get_time", "arguments": {</tool_call> done'},
    unknown_tool={"unknown tool stays text": '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>'},
    render=("get_weather", {"city": "Rome"}),
    markers=frozenset({"<tool_call>", "</tool_call>"}),
    two_calls=(P.render_call("get_time", {}) + "\n" + P.render_call("get_time", {}),),
    grammar_accepts=(P.render_call("get_time", {}) + "\n" + P.render_call("get_weather", {"city": "Oslo"}),),
)
