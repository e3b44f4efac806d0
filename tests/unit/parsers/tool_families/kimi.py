"""Kimi K2: ``functions.NAME:INDEX`` calls in a section of calls."""

from __future__ import annotations

from tests.unit.parsers.tool_families.spec import Family
from tests.unit.parsers.tool_split import call

BEGIN, END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"


def one(name: str, index: int, args: str) -> str:
    return f"<|tool_call_begin|>functions.{name}:{index}<|tool_call_argument_begin|>{args}<|tool_call_end|>"


FAMILY = Family(
    name="kimi",
    calls={
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
    },
    plain={"plain answer": "It is sunny <|> 22 C."},
    malformed={
        "cut off inside a call stays text": (
            BEGIN + '<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"ci'
        ),
        "malformed json stays text": BEGIN + one("get_weather", 0, "{'city': 'Paris'") + END + " ok",
        "a header without its index stays text": (
            BEGIN + "<|tool_call_begin|>functions.get_time<|tool_call_argument_begin|>{}<|tool_call_end|>" + END
        ),
    },
    unknown_tool={"unknown tool stays text": BEGIN + one("rm_rf", 0, '{"path": "/"}') + END},
    render=("get_weather", {"city": "Rome"}),
    rendered=BEGIN + one("get_weather", 0, '{"city": "Rome"}') + END,
    markers=frozenset(
        {
            BEGIN,
            END,
            "<|tool_call_section_begin|>",
            "<|tool_call_section_end|>",
            "<|tool_call_begin|>",
            "<|tool_call_argument_begin|>",
            "<|tool_call_end|>",
        }
    ),
    two_calls=(BEGIN + one("get_time", 0, "{}") * 2 + END,),
    grammar_accepts=(BEGIN + one("get_time", 0, "{}") + one("get_weather", 1, '{"city": "Oslo"}') + END,),
)
