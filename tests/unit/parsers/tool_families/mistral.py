"""Mistral: a JSON array after [TOOL_CALLS], or the v11 NAME[ARGS]{...} form."""

from __future__ import annotations

from tests.unit.parsers.tool_families.spec import Family
from tests.unit.parsers.tool_split import call
from vllmmlxd.parsers.tools import tool_parser_class

P = tool_parser_class("mistral")

FAMILY = Family(
    name="mistral",
    calls={
        "v11 call after text": (
            'Let me check.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
            [("content", "Let me check."), call("get_weather", '{"city": "Paris"}')],
        ),
        "v11 parallel calls": (
            '[TOOL_CALLS]get_weather[ARGS]{"city": "Lyon", "days": 2}[TOOL_CALLS]get_time[ARGS]{}',
            [call("get_weather", '{"city": "Lyon", "days": 2}'), call("get_time", "{}")],
        ),
        "v11 call with a call id": (
            '[TOOL_CALLS]get_weather[CALL_ID]a1B2c3D4e[ARGS]{"city": "Oslo"}',
            [call("get_weather", '{"city": "Oslo"}')],
        ),
        "json array, parallel": (
            'Sure.[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Nice"}, "id": "Ab3dE5gH9"}, '
            '{"name": "get_time", "arguments": {}, "id": "Zx8yW7vU6"}]',
            [("content", "Sure."), call("get_weather", '{"city": "Nice"}'), call("get_time", "{}")],
        ),
        "arguments written as a JSON string": (
            '[TOOL_CALLS][{"name": "get_weather", "arguments": "{\\"city\\": \\"Bern\\"}"}]',
            [call("get_weather", '{"city": "Bern"}')],
        ),
        "text after the json closes stays content": (
            "[TOOL_CALLS]get_time[ARGS]{}\nDone.",
            [call("get_time", "{}"), ("content", "\nDone.")],
        ),
        "braces and markers inside strings": (
            '[TOOL_CALLS]get_weather[ARGS]{"city": "}] [TOOL_CALLS]x[ARGS]{"}',
            [call("get_weather", '{"city": "}] [TOOL_CALLS]x[ARGS]{"}')],
        ),
    },
    plain={"plain answer": "Use [brackets] and {braces} freely."},
    malformed={
        "json cut off before eos stays text": '[TOOL_CALLS]get_weather[ARGS]{"city": "Par',
        "malformed json stays text": '[TOOL_CALLS]get_weather[ARGS]{"city": Paris} ok',
        "no header after the marker stays text": "[TOOL_CALLS] I cannot call a tool for that.",
    },
    unknown_tool={"unknown tool stays text": '[TOOL_CALLS]rm_rf[ARGS]{"path": "/"}'},
    render=("get_weather", {"city": "Rome"}),
    rendered='[TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}',
    markers=frozenset({"[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"}),
    two_calls=(P.render_call("get_time", {}) * 2,),
    grammar_accepts=(P.render_call("get_time", {}) + P.render_call("get_weather", {"city": "Oslo"}),),
)
