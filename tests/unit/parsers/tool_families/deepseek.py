"""DeepSeek: the V3 / R1 fenced form and the V3.1 form, in a section of calls."""

from __future__ import annotations

from tests.unit.parsers.tool_families.spec import Family
from tests.unit.parsers.tool_split import call

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
BEGIN, END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"


def v3(name: str, args: str) -> str:
    return f"{BEGIN}function{SEP}{name}\n```json\n{args}\n```{END}"


def v31(name: str, args: str) -> str:
    return f"{BEGIN}{name}{SEP}{args}{END}"


FAMILY = Family(
    name="deepseek",
    calls={
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
    },
    plain={"plain answer": "It is sunny | 22 C."},
    malformed={
        "cut off inside a call stays text": CALLS_BEGIN + BEGIN + "get_weather" + SEP + '{"city": "Ro',
        "malformed json stays text": CALLS_BEGIN + v3("get_weather", "{city: Paris}") + CALLS_END + " ok",
    },
    unknown_tool={"unknown tool stays text": CALLS_BEGIN + v31("rm_rf", '{"path": "/"}') + CALLS_END},
    render=("get_weather", {"city": "Rome"}),
    rendered=CALLS_BEGIN + v3("get_weather", '{"city": "Rome"}') + CALLS_END,
    markers=frozenset({CALLS_BEGIN, CALLS_END, BEGIN, END, SEP}),
    two_calls=(CALLS_BEGIN + v3("get_time", "{}") * 2 + CALLS_END,),
    grammar_accepts=(CALLS_BEGIN + v3("get_time", "{}") + v3("get_weather", '{"city": "Oslo"}') + CALLS_END,),
)
