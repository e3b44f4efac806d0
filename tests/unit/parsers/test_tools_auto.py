"""Auto, beyond the contract (test_tool_contract.py): it writes calls as hermes does, and the
family of a chat template or a tokenizer's vocabulary."""

from __future__ import annotations

import pytest

from vllmmlxd.parsers.tools import tool_parser_class
from vllmmlxd.parsers.tools.auto import family_for_template


def test_render_call_is_hermes():
    assert tool_parser_class("auto").render_call("get_time", {}) == tool_parser_class("hermes").render_call(
        "get_time", {}
    )


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
