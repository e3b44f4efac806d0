"""Tools and tool_choice in no family's words: what is parsed, what is forced, what is refused."""

from __future__ import annotations

import pytest

from tests.support.grammar import accepts
from vllmmlxd.api.structured import anthropic_output_format, openai_output_format
from vllmmlxd.api.tooling import ToolChoice, anthropic_tool_choice, call_id, openai_tool_choice, plan_tools
from vllmmlxd.errors import InvalidRequest
from vllmmlxd.parsers.tools import tool_parser_class

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": n,
            "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
        },
    }
    for n in ("a", "b")
]


def plan(choice: ToolChoice, tools=TOOLS, auto_enabled=True):
    return plan_tools(tools, choice, parser="hermes", auto_enabled=auto_enabled, after_reasoning=False)


def test_auto_parses_calls_unless_switched_off_and_forces_nothing():
    p = plan(ToolChoice("auto"))
    assert p.use.parse_calls and p.constraint is None
    assert not plan(ToolChoice("auto"), auto_enabled=False).use.parse_calls


def test_none_keeps_the_tools_and_parses_nothing():
    p = plan(ToolChoice("none"))
    assert p.use.tools == tuple(TOOLS) and not p.use.parse_calls and p.constraint is None


def test_required_and_named_force_the_family_format():
    hermes = tool_parser_class("hermes")
    required = plan(ToolChoice("required")).constraint.grammar
    assert accepts(required, hermes.render_call("b", {"x": 1}))
    named = plan(ToolChoice("named", "a", parallel=False)).constraint.grammar
    assert accepts(named, hermes.render_call("a", {"x": 1})) and not accepts(named, hermes.render_call("b", {"x": 1}))
    assert not accepts(named, hermes.render_call("a", {"x": 1}) + "\n" + hermes.render_call("a", {"x": 2}))


@pytest.mark.parametrize(
    "choice,tools",
    [
        (ToolChoice("required"), None),
        (ToolChoice("named", "zz"), TOOLS),
        (ToolChoice("auto"), [{"type": "function", "function": {"description": "no name"}}]),
    ],
)
def test_impossible_choices_are_400s(choice, tools):
    with pytest.raises(InvalidRequest):
        plan(choice, tools=tools)


def test_the_families_words_for_tool_choice():
    assert openai_tool_choice(None, None) == ToolChoice("auto", parallel=False)
    assert openai_tool_choice("required", None) == ToolChoice("required", parallel=False)  # one call, unless asked
    assert openai_tool_choice("required", True) == ToolChoice("required", parallel=True)
    assert openai_tool_choice({"type": "function", "function": {"name": "a"}}, None) == ToolChoice(
        "named", "a", parallel=False
    )
    with pytest.raises(InvalidRequest):
        openai_tool_choice("sometimes", None)
    assert anthropic_tool_choice("any", None, True) == ToolChoice("required", parallel=False)
    assert anthropic_tool_choice("any", None, None) == ToolChoice("required", parallel=False)
    assert anthropic_tool_choice("any", None, False) == ToolChoice("required", parallel=True)
    assert anthropic_tool_choice("tool", "a", None) == ToolChoice("named", "a", parallel=False)
    with pytest.raises(InvalidRequest):
        anthropic_tool_choice("tool", None, None)


def test_call_ids_are_stable_per_request_and_index():
    assert (
        call_id("call_", "r1", 0) == call_id("call_", "r1", 0) != call_id("call_", "r1", 1) != call_id("call_", "r2", 1)
    )


def test_output_formats_and_the_check_of_their_result():
    fmt = openai_output_format(
        {
            "type": "json_schema",
            "json_schema": {
                "name": "n",
                "strict": True,
                "schema": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
            },
        }
    )
    assert fmt.schema["additionalProperties"] is False  # strict
    assert fmt.problem('{"x": 1}') is None
    assert "does not match" in fmt.problem('{"x": "one"}') and "not JSON" in fmt.problem("{")
    assert openai_output_format({"type": "text"}) is None
    assert openai_output_format({"type": "json_object"}).schema == {"type": "object"}
    assert anthropic_output_format({"type": "json_schema", "schema": {"type": "array"}}).schema == {"type": "array"}
    with pytest.raises(InvalidRequest) as e:
        openai_output_format({"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": 7}}})
    assert e.value.param == "response_format.json_schema.schema"
