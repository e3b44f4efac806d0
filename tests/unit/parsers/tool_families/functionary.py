"""Functionary: v3.2's ``>>>name`` segments (the first ``>>>`` written by the prompt) and v3.1's
``<function=name>`` calls. The v3.2 segment ``all`` is the answer: its header is no content."""

from __future__ import annotations

from tests.unit.parsers.tool_families.spec import TOOLS, Family
from tests.unit.parsers.tool_split import call
from vllmmlxd.parsers.tools import tool_parser_class

P = tool_parser_class("functionary")

PYTHON = {
    "type": "function",
    "function": {
        "name": "python",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
    },
}

FAMILY = Family(
    name="functionary",
    tools=[*TOOLS, PYTHON],
    calls={
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
    },
    plain={
        "v3.2: plain answer": (
            "all\nThe capital of France is Paris.",
            [("content", "The capital of France is Paris.")],
        ),
        "v3.2: plain answer without all": "Paris\n\nIt is the capital of France; try >>> in Python's REPL.",
    },
    malformed={
        "v3.2: unfinished json stays text": (
            'all\nChecking.>>>get_weather\n{"city": "Par',
            [("content", 'Checking.>>>get_weather\n{"city": "Par')],
        ),
        "v3.2: bad json stays text": (
            'all\nChecking.>>>get_weather\n{"city": Paris} ok',
            [("content", 'Checking.>>>get_weather\n{"city": Paris} ok')],
        ),
        "v3.1: bad name stays text": "<function=get time>{}</function>",
    },
    unknown_tool={
        "v3.2: unknown tool stays text": 'rm_rf\n{"path": "/"}',
        "v3.1: unknown tool stays text": '<function=rm_rf>{"path": "/"}</function>',
    },
    render=("get_weather", {"city": "Rome", "days": 2}),
    markers=frozenset(),  # plain text, no special tokens
    two_calls=(P.render_call("get_time", {}) + P.render_call("get_time", {}),),
    grammar_accepts=(
        'get_weather\n{"city": "Lyon"}>>>get_time\n{}',  # the first >>> in the prompt
        '<function=get_weather>{"city": "Lyon"}</function>\n<function=get_time>{}</function>',
    ),
    grammar_refuses=("<function=rm_rf>{}</function>", "all\nSure! " + P.render_call("get_time", {})),
)
