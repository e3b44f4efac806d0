"""Granite: 3.x's array after <|tool_call|> (or a plain <tool_call>), 4.x's hermes-style blocks."""

from __future__ import annotations

from tests.unit.parsers.tool_families.spec import Family
from tests.unit.parsers.tool_split import call
from vllmmlxd.parsers.tools import tool_parser_class

P = tool_parser_class("granite")

FAMILY = Family(
    name="granite",
    calls={
        "3.0: special token and an array, after text": (
            'Let me look that up.<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]',
            [("content", "Let me look that up."), call("get_weather", '{"city": "Paris"}')],
        ),
        "3.0: parallel calls in one array": (
            '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Lyon", "days": 2}}, {"name": "get_time", "arguments": {}}]',
            [call("get_weather", '{"city": "Lyon", "days": 2}'), call("get_time", "{}")],
        ),
        "3.1+: plain <tool_call> and an array, no end marker": (
            '<tool_call>[{"name": "get_time", "arguments": {}}]',
            [call("get_time", "{}")],
        ),
        "3.x: the call ends where its array closes": (
            '<|tool_call|>[{"name": "get_time", "arguments": {}}]\nOne moment.',
            [call("get_time", "{}"), ("content", "\nOne moment.")],
        ),
        "3.x: arguments given as JSON text": (
            '<|tool_call|>[{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}]',
            [call("get_weather", '{"city": "Oslo"}')],
        ),
        "4.x: hermes-style block after text": (
            "I'll check the weather in Paris for you.\n"
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
            [("content", "I'll check the weather in Paris for you.\n"), call("get_weather", '{"city": "Paris"}')],
        ),
        "4.x: parallel blocks": (
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
            [call("get_weather", '{"city": "Lyon"}'), ("content", "\n"), call("get_time", "{}")],
        ),
        "brackets and markers inside strings (3.x)": (
            '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "]} <|tool_call|>[{"}}]',
            [call("get_weather", '{"city": "]} <|tool_call|>[{"}')],
        ),
        "end marker inside a string (4.x)": (
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "} </tool_call> {"}}\n</tool_call>',
            [call("get_weather", '{"city": "} </tool_call> {"}')],
        ),
        "4.x: no end marker before eos": (
            '<tool_call>\n{"name": "get_time", "arguments": {}}\n',
            [call("get_time", "{}")],
        ),
    },
    plain={"plain answer": "Paris is sunny today [22 °C] <3 {no rain}."},
    malformed={
        "unfinished array stays text": 'Checking. <|tool_call|>[{"name": "get_weather", "arguments": {"city": "Par',
        "bad json stays text": '<tool_call>\n{"name": "get_time" "arguments": {}}\n</tool_call> ok',
        "not json after the marker stays text": '<|tool_call|>get_weather(city="Paris")',
    },
    unknown_tool={
        "unknown tool stays text": (
            '<|tool_call|>[{"name": "get_time", "arguments": {}}, {"name": "rm_rf", "arguments": {}}]'
        ),
    },
    render=("get_weather", {"city": "Rome", "days": 2}),
    markers=frozenset({"<|tool_call|>", "<tool_call>", "</tool_call>"}),
    two_calls=(
        P.render_call("get_time", {}) + "\n" + P.render_call("get_time", {}),
        '<|tool_call|>[{"name": "get_time", "arguments": {}}, {"name": "get_time", "arguments": {}}]',
    ),
    grammar_accepts=(
        P.render_call("get_time", {}) + "\n" + P.render_call("get_weather", {"city": "Oslo"}),
        '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Lyon"}}, {"name": "get_time", "arguments": {}}]',
    ),
    grammar_refuses=('<|tool_call|>[{"name": "rm_rf", "arguments": {}}]',),
)
