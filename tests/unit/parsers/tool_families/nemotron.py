"""Llama-Nemotron: a JSON array of calls in <TOOLCALL> tags."""

from __future__ import annotations

from tests.unit.parsers.tool_families.spec import Family
from tests.unit.parsers.tool_split import call

FAMILY = Family(
    name="nemotron",
    calls={
        "one call after text": (
            "I'll check the current weather in Paris.\n"
            '<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</TOOLCALL>',
            [("content", "I'll check the current weather in Paris.\n"), call("get_weather", '{"city": "Paris"}')],
        ),
        "parallel calls in one block": (
            '<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Lyon", "days": 2}}, '
            '{"name": "get_time", "arguments": {}}]</TOOLCALL>',
            [call("get_weather", '{"city": "Lyon", "days": 2}'), call("get_time", "{}")],
        ),
        "arguments as a JSON string": (
            '<TOOLCALL>[{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}]</TOOLCALL>',
            [call("get_weather", '{"city": "Oslo"}')],
        ),
        "two blocks, text after": (
            '<TOOLCALL>[{"name": "get_time", "arguments": {}}]</TOOLCALL>\n'
            '<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Rome"}}]</TOOLCALL> Done.',
            [call("get_time", "{}"), ("content", "\n"), call("get_weather", '{"city": "Rome"}'), ("content", " Done.")],
        ),
        "brackets and markers inside strings": (
            '<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "]} </TOOLCALL> <TOOLCALL>[{"}}]</TOOLCALL>',
            [call("get_weather", '{"city": "]} </TOOLCALL> <TOOLCALL>[{"}')],
        ),
        "no end marker before eos": (
            '<TOOLCALL>[{"name": "get_time", "arguments": {}}]',
            [call("get_time", "{}")],
        ),
    },
    plain={"plain answer": "Open the <TOOLS> menu, then pick [Settings] {advanced}."},
    malformed={
        "unfinished json stays text": 'Sure. <TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Par',
        "bad json stays text": '<TOOLCALL>[{"name": "get_time", "arguments": {}},]</TOOLCALL> ok',
        "not json stays text": "<TOOLCALL>get_time()</TOOLCALL>",
    },
    unknown_tool={
        "unknown tool stays text": '<TOOLCALL>[{"name": "rm_rf", "arguments": {"path": "/"}}]</TOOLCALL>',
    },
    render=("get_weather", {"city": "Rome", "days": 2}),
    markers=frozenset({"<TOOLCALL>", "</TOOLCALL>"}),
    two_calls=('<TOOLCALL>[{"name": "get_time", "arguments": {}}, {"name": "get_time", "arguments": {}}]</TOOLCALL>',),
    grammar_accepts=(
        '<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Lyon"}}, {"name": "get_time", "arguments": {}}]</TOOLCALL>',
    ),
    grammar_refuses=("<TOOLCALL>[]</TOOLCALL>",),
)
