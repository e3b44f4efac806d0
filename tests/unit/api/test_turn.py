"""Each family's request as the neutral turn (``to_turn``), and the one rule for failed tool results."""

from __future__ import annotations

import pytest

from vllmmlxd.api.anthropic import translate as anthropic
from vllmmlxd.api.anthropic.protocol import CountTokensRequest, MessagesRequest
from vllmmlxd.api.body import validate
from vllmmlxd.api.openai import translate as openai
from vllmmlxd.api.openai.protocol import ChatCompletionRequest
from vllmmlxd.api.sampling import SamplingRequest
from vllmmlxd.api.tooling import ToolChoice
from vllmmlxd.api.turn import ChatPrompt, tool_result_text
from vllmmlxd.errors import InvalidRequest

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}


def test_an_openai_chat_request_is_one_turn():
    req = validate(
        ChatCompletionRequest,
        {
            "model": "m",
            "messages": [{"role": "developer", "content": "be brief"}, {"role": "user", "content": "hi"}],
            "tools": [TOOL],
            "tool_choice": "required",
            "parallel_tool_calls": True,
            "max_completion_tokens": 7,
            "temperature": 0.5,
            "stop": "x",
            "response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}},
            "chat_template_kwargs": {"enable_thinking": False},
            "stream": True,
        },
    )
    turn = openai.to_turn(req)
    assert turn.prompt == ChatPrompt(
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        [TOOL],
        {"enable_thinking": False},
    )
    assert turn.sampling == SamplingRequest(max_tokens=7, temperature=0.5, stop=("x",))
    assert turn.tool_choice == ToolChoice("required", parallel=True)
    assert turn.output.schema == SCHEMA and turn.output.param == "response_format.json_schema.schema"
    assert turn.stream and turn.id_prefix == "chatcmpl-"


def test_an_anthropic_messages_request_is_one_turn():
    body = {
        "model": "m",
        "max_tokens": 9,
        "system": "be brief",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"name": "get_weather", "input_schema": TOOL["function"]["parameters"]}],
        "tool_choice": {"type": "tool", "name": "get_weather"},
        "thinking": {"type": "disabled"},
        "output_format": {"type": "json_schema", "schema": SCHEMA},
        "stop_sequences": ["x"],
    }
    turn = anthropic.to_turn(validate(MessagesRequest, body))
    assert turn.prompt == ChatPrompt(
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        [TOOL],
        {"enable_thinking": False},
    )
    assert turn.sampling == SamplingRequest(max_tokens=9, stop=("x",))
    assert turn.tool_choice == ToolChoice("named", "get_weather", parallel=False)
    assert turn.output.schema == SCHEMA and not turn.stream and turn.id_prefix == "msg_"
    # count_tokens shapes the prompt with the same function
    count = {k: v for k, v in body.items() if k not in ("max_tokens", "output_format", "stop_sequences")}
    assert anthropic.to_prompt(validate(CountTokensRequest, count)) == turn.prompt


def test_a_failed_tool_result_says_so_once():
    assert tool_result_text("no such file", True) == "Error: no such file"
    assert tool_result_text("error: no such file", True) == "error: no such file"
    assert tool_result_text("", True) == "Error"
    assert tool_result_text("fine", False) == "fine"


def test_the_three_places_that_show_tool_results_share_the_rule():
    # An Anthropic tool_result, an OpenAI mcp_calls replay: the same text for the same failure.
    a = validate(
        MessagesRequest,
        {
            "max_tokens": 5,
            "messages": [
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "t1", "is_error": True, "content": "boom"}],
                },
            ],
        },
    )
    o = validate(
        ChatCompletionRequest,
        {
            "messages": [
                {
                    "role": "assistant",
                    "content": "",
                    "mcp_calls": [
                        {
                            "id": "c1",
                            "function": {"name": "f", "arguments": "{}"},
                            "result": {"content": [{"type": "text", "text": "boom"}], "is_error": True},
                        }
                    ],
                }
            ]
        },
    )
    assert anthropic.to_turn(a).prompt.messages[-1]["content"] == "Error: boom"
    assert [m["content"] for m in openai.to_turn(o).prompt.messages if m["role"] == "tool"] == ["Error: boom"]


@pytest.mark.parametrize("template", ["{{ messages }}", ""])
def test_a_client_chat_template_is_a_400_naming_it_in_both_families(template):
    ask = [{"role": "user", "content": "hi"}]
    with pytest.raises(InvalidRequest) as got:
        openai.to_turn(validate(ChatCompletionRequest, {"messages": ask, "chat_template": template}))
    assert got.value.param == "chat_template"
    for model, extra in ((MessagesRequest, {"max_tokens": 5}), (CountTokensRequest, {})):
        with pytest.raises(InvalidRequest) as got:
            anthropic.to_prompt(validate(model, {"messages": ask, "chat_template": template, **extra}))
        assert got.value.param == "chat_template"
    openai.to_turn(validate(ChatCompletionRequest, {"messages": ask, "chat_template": None}))  # asks for nothing
