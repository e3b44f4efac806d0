"""Auto: the family told by the first marker, golden texts split at every boundary; the family of a chat template."""

from __future__ import annotations

import pytest

from tests.support.grammar import accepts, compile_error
from tests.unit.parsers.tool_split import assert_splits_agree, call, run
from vllmmlxd.parsers.tools import tool_parser_class
from vllmmlxd.parsers.tools.auto import family_for_template

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
]
P = tool_parser_class("auto")
DS_BEGIN, DS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DS_CALL = "<｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜>"
KIMI = "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:0<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>"

GOLDEN = {
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
    "malformed call stays text": (
        '<tool_call>{"name": "get_time", "arguments": {</tool_call> ok',
        [("content", '<tool_call>{"name": "get_time", "arguments": {</tool_call> ok')],
    ),
    "unknown tool stays text": (
        "Checking." + DS_BEGIN + DS_CALL.replace("get_time", "rm_rf") + DS_END,
        [("content", "Checking." + DS_BEGIN + DS_CALL.replace("get_time", "rm_rf") + DS_END)],
    ),
    "bare json is not guessed at": (
        '{"name": "get_time", "parameters": {}}',
        [("content", '{"name": "get_time", "parameters": {}}')],
    ),
    "plain answer ending in a marker's prefix": ("It is sunny <tool_", [("content", "It is sunny <tool_")]),
}


@pytest.mark.parametrize("name", GOLDEN)
def test_golden_split_at_every_boundary(name):
    text, expected = GOLDEN[name]
    assert_splits_agree("auto", TOOLS, text, expected)


def test_calls_are_counted():
    parser = P(TOOLS)
    parser.feed("[TOOL_CALLS]get_time[ARGS]{}[TOOL_CALLS]get_time[ARGS]{}")
    parser.finish()
    assert parser.calls == 2


def test_markers_are_every_familys():
    for family in ("qwen", "mistral", "llama", "deepseek", "kimi"):
        assert tool_parser_class(family).markers <= P.markers


def test_render_call_and_grammar_are_hermes():
    hermes = tool_parser_class("hermes")
    assert P.render_call("get_time", {}) == hermes.render_call("get_time", {})
    assert run("auto", TOOLS, [P.render_call("get_weather", {"city": "Rome"})]) == [
        call("get_weather", '{"city": "Rome"}')
    ]
    g = P.grammar(TOOLS)
    assert compile_error(g) is None
    assert accepts(g, P.render_call("get_weather", {"city": "Paris", "days": 3}))
    assert not accepts(g, P.render_call("get_weather", {"city": "Paris", "days": 9}))
    assert not accepts(g, P.render_call("rm_rf", {}))


# Fragments of the real chat templates, enough to tell each family.
TEMPLATES = {
    "qwen": "{{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}{%- for args_name in tool_call.arguments %}"
    "{{- '<parameter=' + args_name + '>\\n' }}",
    "hermes": '{{- "<tool_call>\\n{\\"name\\": \\"" }}{{- tool_call.name }}{{- "\\", \\"arguments\\": " }}',
    "mistral": '{{- "[TOOL_CALLS]" + tool_call.function.name + "[ARGS]" + arguments }}',
    "llama": "{{- '<|python_tag|>' + tool_call.name + '.call(' }}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}",
    "deepseek": "{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name']}}",
    "kimi": "<|tool_calls_section_begin|>{%- for tool_call in message['tool_calls'] -%}<|tool_call_begin|>{{ tool_call['id'] }}",
}


@pytest.mark.parametrize("family", TEMPLATES)
def test_family_for_template(family):
    assert family_for_template(TEMPLATES[family], None) == family


def test_family_for_a_llama3_template_without_the_tag():
    template = (
        "<|start_header_id|>user<|end_header_id|>\\n\\nGiven the following functions, respond with a JSON for a "
        'function call with its proper arguments. Respond in the format {"name": function name, "parameters": '
        "dictionary of argument name and its value}."
    )
    assert family_for_template(template, None) == "llama"


def test_family_from_the_vocabulary_when_the_template_says_nothing():
    assert family_for_template("{{ messages }}", {"[INST]", "[TOOL_CALLS]"}) == "mistral"
    assert family_for_template(None, {"<|python_tag|>"}) == "llama"
    assert family_for_template(None, {"<tool_call>", "</tool_call>"}) == "hermes"
    assert family_for_template("{{ messages }}", {"<s>"}) is None
    assert family_for_template(None, None) is None
