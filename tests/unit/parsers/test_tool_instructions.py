"""Tools for a template that ignores them: offered in the system message in the family's format."""

from __future__ import annotations

from vllmmlxd.engine.text.tool_setup import resolve_tool_parser, template_renders_tools
from vllmmlxd.parsers.tools import tool_parser_class
from vllmmlxd.parsers.tools.instructions import calls_as_text, with_tool_instructions

HERMES = tool_parser_class("hermes")
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def test_instructions_join_the_system_message_or_become_one():
    msgs = [{"role": "user", "content": "hi"}]
    out = with_tool_instructions(msgs, TOOLS, HERMES)
    assert out[0]["role"] == "system" and '"name": "get_weather"' in out[0]["content"]
    assert HERMES.render_call("get_weather", {"city": "..."}) in out[0]["content"] and out[1:] == msgs
    out = with_tool_instructions([{"role": "system", "content": "Be brief."}, *msgs], TOOLS, HERMES)
    assert out[0]["content"].startswith("Be brief.\n\n") and len(out) == 2


def test_earlier_calls_are_written_into_the_assistant_turn():
    msgs = [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
            ],
        }
    ]
    [turn] = calls_as_text(msgs, HERMES)
    assert "tool_calls" not in turn and turn["content"] == HERMES.render_call("get_weather", {"city": "Oslo"})


def test_a_template_that_ignores_tools_is_detected():
    assert not template_renders_tools(lambda messages, tools: "same prompt")
    assert template_renders_tools(lambda messages, tools: f"prompt {tools}")
    assert not template_renders_tools(lambda messages, tools: 1 / 0 if tools else "refuses tools")


def test_the_family_comes_from_config_else_the_template_else_hermes():
    assert resolve_tool_parser("mistral", "<tool_call>", None) == ("mistral", "config")
    assert resolve_tool_parser("auto", "{{ '[TOOL_CALLS]' }}", None) == ("mistral", "template")
    assert resolve_tool_parser("auto", "{{ messages }}", set()) == ("hermes", "fallback")


def test_example_arguments_read_any_property_schema():
    # A type given as a list, or a property schema that is a bool, are valid JSON Schema: they
    # once raised (an unhashable list as a dict key; .get on True) while writing the instructions.
    params = {
        "type": "object",
        "properties": {"city": {"type": ["string", "null"]}, "n": True, "k": {"type": "integer"}},
    }
    tools = [{"type": "function", "function": {"name": "f", "parameters": params}}]
    out = with_tool_instructions([{"role": "user", "content": "hi"}], tools, HERMES)
    assert HERMES.render_call("f", {"city": "...", "n": "...", "k": 1}) in out[0]["content"]
