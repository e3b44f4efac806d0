"""Auto: the family told by the first marker the model writes (hermes, Qwen3-Coder XML, Mistral,
Llama, DeepSeek, Kimi); its render_call and grammar are hermes'."""

from __future__ import annotations

from tests.unit.parsers.tool_families import deepseek, kimi, llama, mistral, qwen
from tests.unit.parsers.tool_families.spec import Family
from tests.unit.parsers.tool_split import call
from vllmmlxd.parsers.tools import tool_parser_class

P = tool_parser_class("auto")
DS_BEGIN, DS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DS_CALL = "<｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜>"
KIMI = "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:0<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>"
# The families auto reads: their markers are its own.
READS = (qwen, mistral, llama, deepseek, kimi)

FAMILY = Family(
    name="auto",
    calls={
        "hermes json after text": (
            'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
            [("content", "Let me check.\n"), call("get_weather", '{"city": "Paris"}')],
        ),
        "qwen3-coder xml, parallel": (
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nLyon\n</parameter>\n<parameter=days>\n2\n</parameter>\n"
            "</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n</function>\n</tool_call>",
            [call("get_weather", '{"city": "Lyon", "days": 2}'), ("content", "\n"), call("get_time", "{}")],
        ),
        "mistral v11 parallel": (
            'Sure.[TOOL_CALLS]get_weather[ARGS]{"city": "Nice"}[TOOL_CALLS]get_time[ARGS]{}',
            [("content", "Sure."), call("get_weather", '{"city": "Nice"}'), call("get_time", "{}")],
        ),
        "mistral v11, the same call twice": (
            "[TOOL_CALLS]get_time[ARGS]{}[TOOL_CALLS]get_time[ARGS]{}",
            [call("get_time", "{}"), call("get_time", "{}")],
        ),
        "llama python tag": (
            '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}',
            [call("get_weather", '{"city": "Oslo"}')],
        ),
        "deepseek section": (
            "Checking." + DS_BEGIN + DS_CALL + DS_END,
            [("content", "Checking."), call("get_time", "{}")],
        ),
        "kimi section": (
            "One moment." + KIMI + "\nDone.",
            [("content", "One moment."), call("get_time", "{}"), ("content", "\nDone.")],
        ),
        "the first family keeps reading, other markers are text": (
            '<tool_call>{"name": "get_time", "arguments": {}}</tool_call> [TOOL_CALLS]get_time[ARGS]{}',
            [call("get_time", "{}"), ("content", " [TOOL_CALLS]get_time[ARGS]{}")],
        ),
        "markers inside strings": (
            '<tool_call>{"name": "get_weather", "arguments": {"city": "[TOOL_CALLS] <|python_tag|>"}}</tool_call>',
            [call("get_weather", '{"city": "[TOOL_CALLS] <|python_tag|>"}')],
        ),
        "no end before eos": (
            '[TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}',
            [call("get_weather", '{"city": "Rome"}')],
        ),
    },
    plain={
        "bare json is not guessed at": '{"name": "get_time", "parameters": {}}',
        "plain answer ending in a marker's prefix": "It is sunny <tool_",
    },
    malformed={"malformed call stays text": '<tool_call>{"name": "get_time", "arguments": {</tool_call> ok'},
    unknown_tool={"unknown tool stays text": "Checking." + DS_BEGIN + DS_CALL.replace("get_time", "rm_rf") + DS_END},
    render=("get_weather", {"city": "Rome"}),
    markers=frozenset().union(*(family.FAMILY.markers for family in READS)),
    two_calls=(P.render_call("get_time", {}) + "\n" + P.render_call("get_time", {}),),
)
