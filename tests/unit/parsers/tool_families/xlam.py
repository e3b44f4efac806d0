"""xLAM: a JSON array of calls as the answer, or fenced, or after [TOOL_CALLS], or in <tool_call> tags."""

from __future__ import annotations

from tests.unit.parsers.tool_families.spec import Family
from tests.unit.parsers.tool_split import call

FAMILY = Family(
    name="xlam",
    calls={
        "the answer is a call array": (
            '[{"name": "get_weather", "arguments": {"city": "Paris"}}]',
            [call("get_weather", '{"city": "Paris"}')],
        ),
        "parallel calls, space before": (
            '\n[{"name": "get_weather", "arguments": {"city": "Lyon", "days": 2}}, {"name": "get_time", "arguments": {}}]',
            [("content", "\n"), call("get_weather", '{"city": "Lyon", "days": 2}'), call("get_time", "{}")],
        ),
        "fenced block after text": (
            'I will look up the weather.\n```json\n[{"name": "get_weather", "arguments": {"city": "Paris"}}]\n```',
            [("content", "I will look up the weather.\n"), call("get_weather", '{"city": "Paris"}')],
        ),
        "after [TOOL_CALLS]": (
            '[TOOL_CALLS][{"name": "get_time", "arguments": {}}]',
            [call("get_time", "{}")],
        ),
        "[TOOL_CALLS] after text": (
            'Checking. [TOOL_CALLS] [{"name": "get_time", "arguments": {}}]',
            [("content", "Checking. "), call("get_time", "{}")],
        ),
        "within <tool_call> tags": (
            '<tool_call>\n[{"name": "get_weather", "arguments": {"city": "Oslo"}}]\n</tool_call>',
            [call("get_weather", '{"city": "Oslo"}')],
        ),
        "brackets and markers inside strings": (
            '[{"name": "get_weather", "arguments": {"city": "]} ``` [TOOL_CALLS] </tool_call> [{"}}]',
            [call("get_weather", '{"city": "]} ``` [TOOL_CALLS] </tool_call> [{"}')],
        ),
        "text after the array stays content": (
            '[{"name": "get_time", "arguments": {}}]\nLet me know if you need more.',
            [call("get_time", "{}"), ("content", "\nLet me know if you need more.")],
        ),
        "fenced block with no closing fence before eos": (
            '```json\n[{"name": "get_time", "arguments": {}}]\n',
            [call("get_time", "{}")],
        ),
    },
    plain={
        "json that is not calls stays text": (
            'Here it is:\n```json\n[{"city": "Paris", "temp": 21}]\n```\nAnything else?'
        ),
        "an answer that starts with a bracket": "[1] Smith et al. report 21 °C in Paris.",
        "an array later in the answer is not a call": (
            'You could call [{"name": "get_time", "arguments": {}}] yourself.'
        ),
        "plain answer with a code block": "Use this:\n```python\nprint({'a': [1]})\n```",
    },
    malformed={
        "unfinished array stays text": '[{"name": "get_weather", "arguments": {"city": "Par',
        "bad json stays text": '[{"name": "get_time", "arguments": {}},]',
    },
    unknown_tool={"unknown tool stays text": '[{"name": "rm_rf", "arguments": {"path": "/"}}]'},
    render=("get_weather", {"city": "Rome", "days": 2}),
    markers=frozenset({"[TOOL_CALLS]", "<tool_call>", "</tool_call>"}),
    two_calls=('[{"name": "get_time", "arguments": {}}, {"name": "get_time", "arguments": {}}]',),
    grammar_accepts=(
        '[{"name": "get_weather", "arguments": {"city": "Lyon"}}, {"name": "get_time", "arguments": {}}]',
    ),
    grammar_refuses=("[]",),
)
