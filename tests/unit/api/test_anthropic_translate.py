"""Unit tests of the Anthropic wire models and their pure translation for the chat template."""

import pytest

from vllmmlxd.api.anthropic import translate as tr
from vllmmlxd.api.anthropic.protocol import CountTokensRequest, MessagesRequest, error_body
from vllmmlxd.api.body import validate
from vllmmlxd.api.sampling import SamplingRequest, resolve_sampling
from vllmmlxd.config.schema import ModelConfig
from vllmmlxd.engine.types import Finished, Usage
from vllmmlxd.errors import InvalidRequest, UnprocessableBody

HI = [{"role": "user", "content": "hi"}]
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def req(**kw):
    return MessagesRequest.model_validate({"max_tokens": 16, "messages": HI, **kw})


def convo(*messages, **kw):
    return tr.to_template_messages(req(messages=list(messages), **kw))


# --- the wire models ---


@pytest.mark.parametrize(
    "body,param",
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": "many"}, "max_tokens"),
        ({"temperature": 1.5}, "temperature"),  # Anthropic's range is 0..1
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"stop_sequences": ["x"] * 17}, "stop_sequences"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages.0.role"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages.0.content"),
        ({"messages": [{"role": "user", "content": [{"type": "audio", "data": "x"}]}]}, "messages.0.content.0"),
        ({"thinking": {"type": "sometimes"}}, "thinking.type"),
        ({"thinking": {"type": "enabled", "budget_tokens": 0}}, "thinking.budget_tokens"),
        ({"tool_choice": {"type": "whichever"}}, "tool_choice.type"),
        ({"system": [{"type": "image", "source": {}}]}, "system.0.type"),
    ],
)
def test_bad_values_are_400_naming_the_field(body, param):
    with pytest.raises(InvalidRequest) as e:
        validate(MessagesRequest, {"max_tokens": 16, "messages": HI, **body})
    assert e.value.status_code == 400 and e.value.param == param


@pytest.mark.parametrize(
    "body,param",
    [
        ({"messages": HI}, "max_tokens"),  # required, as Anthropic requires it
        (
            {"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "text"}]}]},
            "messages.0.content.0.text.text",
        ),
        (
            {"max_tokens": 8, "messages": [{"role": "assistant", "content": [{"type": "tool_use", "name": "f"}]}]},
            "messages.0.content.0.tool_use.id",
        ),
    ],
)
def test_a_missing_field_is_named(body, param):
    with pytest.raises(UnprocessableBody) as e:  # 422 here; Anthropic's handler answers it as a 400
        validate(MessagesRequest, body)
    assert e.value.param == param and e.value.message.startswith(param)


def test_count_tokens_takes_the_prompt_fields_without_max_tokens():
    r = validate(
        CountTokensRequest,
        {
            "model": "x",
            "messages": HI,
            "system": "s",
            "tools": [{"name": "f", "input_schema": SCHEMA}],
            "thinking": {"type": "disabled"},
        },
    )
    assert tr.to_template_messages(r)[0][0] == {"role": "system", "content": "s"}
    assert tr.thinking_switch(r) == {"enable_thinking": False}


def test_what_claude_code_sends_is_accepted_and_unknown_fields_ignored():
    body = {
        "model": "claude-sonnet-4-5-20250929",
        "max_tokens": 32000,
        "stream": True,
        "temperature": 1,
        "metadata": {"user_id": "user_abc_account__session_1"},
        "service_tier": "auto",
        "system": [
            {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "Be brief."},
        ],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "<system-reminder>ctx</system-reminder>"},
                    {"type": "text", "text": "list files", "cache_control": {"type": "ephemeral"}},
                ],
            }
        ],
        "tools": [
            {
                "name": "Bash",
                "description": "Run a command",
                "input_schema": {
                    "type": "object",
                    "properties": {"command": {"type": "string"}},
                    "$schema": "http://json-schema.org/draft-07/schema#",
                },
            }
        ],
        "tool_choice": {"type": "auto"},
        "thinking": {"type": "enabled", "budget_tokens": 31999},
        "context_management": {"edits": []},
    }
    r = validate(MessagesRequest, body)
    messages, tools = tr.to_template_messages(r)
    assert messages == [
        {"role": "system", "content": "You are Claude Code.\n\nBe brief."},
        {"role": "user", "content": "<system-reminder>ctx</system-reminder>\n\nlist files"},
    ]
    assert tools[0]["function"]["name"] == "Bash" and tr.thinking_switch(r) == {"enable_thinking": True}


def test_error_body_has_anthropics_shape():
    assert error_body("not_found_error", "no model x") == {
        "type": "error",
        "error": {"type": "not_found_error", "message": "no model x"},
    }


# --- messages for the chat template ---


def test_plain_turns_and_a_system_string():
    messages, tools = convo(
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
        system="be nice",
    )
    assert messages == [
        {"role": "system", "content": "be nice"},
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
    ]
    assert tools is None


def test_no_system_message_without_a_system_prompt():
    assert convo(*HI)[0] == [{"role": "user", "content": "hi"}]
    assert convo(*HI, system=[])[0] == [{"role": "user", "content": "hi"}]


def test_tool_use_becomes_tool_calls_and_results_tool_messages():
    messages, _ = convo(
        {"role": "user", "content": "weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {"city": "Rome"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny, 22C"},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "content": [{"type": "text", "text": "Rain"}, {"type": "text", "text": "12C"}],
                },
            ],
        },
    )
    assert messages[1] == {
        "role": "assistant",
        "content": "Checking.",
        "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            {"id": "toolu_2", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}},
        ],
    }
    assert messages[2:] == [
        {"role": "tool", "tool_call_id": "toolu_1", "content": "Sunny, 22C", "name": "get_weather"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Rain\n\n12C", "name": "get_weather"},
    ]


def test_an_assistant_turn_of_calls_only_has_empty_text():
    messages, _ = convo(
        *HI, {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}
    )
    assert messages[1]["content"] == "" and messages[1]["tool_calls"][0]["function"]["arguments"] == {}


def test_results_come_before_the_text_of_their_turn():
    messages, _ = convo(
        *HI,
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "also this"},
                {"type": "tool_result", "tool_use_id": "t", "content": "ok"},
            ],
        },
    )
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "user"]
    assert messages[-1] == {"role": "user", "content": "also this"}


def test_a_failed_tool_says_so_in_its_text():
    def result(content, is_error=True):
        block = {"type": "tool_result", "tool_use_id": "t", "content": content, "is_error": is_error}
        return convo(*HI, {"role": "user", "content": [block]})[0][1]["content"]

    assert result("file not found") == "Error: file not found"
    assert result("Error: exit code 1") == "Error: exit code 1"  # not said twice
    assert result("") == "Error"
    assert result("file not found", is_error=False) == "file not found"


def test_a_result_for_an_unknown_call_has_no_name():
    messages, _ = convo({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x", "content": "ok"}]})
    assert messages == [{"role": "tool", "tool_call_id": "x", "content": "ok"}]


def test_thinking_is_reasoning_content_and_redacted_thinking_is_dropped():
    messages, _ = convo(
        *HI,
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "2+2 is 4", "signature": "EqQBCgIYAh"},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "4"},
            ],
        },
    )
    assert messages[1] == {"role": "assistant", "content": "4", "reasoning_content": "2+2 is 4"}


@pytest.mark.parametrize(
    "block,param",
    [
        (
            {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}},
            "messages[2].content[1]",
        ),
        (
            {
                "type": "tool_result",
                "tool_use_id": "t",
                "content": [{"type": "text", "text": "see"}, {"type": "document", "source": {}}],
            },
            "messages[2].content[1].content[1]",
        ),
    ],
)
def test_documents_are_a_400_naming_the_block(block, param):
    with pytest.raises(InvalidRequest) as e:
        convo(
            *HI,
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": [{"type": "text", "text": "look"}, block]},
        )
    assert e.value.status_code == 400 and e.value.param == param
    # Anthropic's errors have no param field: the message names the block itself.
    assert e.value.message == f"{param}: document blocks are not supported here"


PNG = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}}


def test_images_are_parts_among_the_text_in_their_order_and_joined_user_turns_keep_them():
    url = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
    messages, _ = convo(
        {"role": "user", "content": [{"type": "text", "text": "one"}, PNG, {"type": "text", "text": "two"}]},
        {"role": "user", "content": [url]},
    )
    [user] = messages
    kinds = [(p["type"], p.get("text")) for p in user["content"]]
    assert kinds == [("text", "one"), ("image", None), ("text", "two"), ("image", None)]
    first, second = user["content"][1]["image"], user["content"][3]["image"]
    assert (first.where, first.media_type, first.data) == ("messages[0].content[1]", "image/png", "iVBO")
    assert (second.where, second.url) == ("messages[1].content[0]", "https://example.com/a.png")


def test_a_tool_results_images_follow_its_text_and_text_alone_stays_a_string():
    result = {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": "shot"}, PNG]}
    messages, _ = convo(
        *HI,
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
        {"role": "user", "content": [result]},
    )
    tool = messages[-1]
    assert tool["role"] == "tool" and [p["type"] for p in tool["content"]] == ["text", "image"]
    assert messages[0]["content"] == "hi"  # no image: the text is a string, rendered as always


@pytest.mark.parametrize("role", ["assistant"])
def test_an_image_outside_a_user_turn_is_a_400(role):
    with pytest.raises(InvalidRequest, match="image blocks are not supported here"):
        convo(*HI, {"role": role, "content": [PNG]})


def test_an_image_source_must_be_data_or_a_url():
    with pytest.raises(InvalidRequest, match="must be base64 data or a url") as e:
        convo({"role": "user", "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}]})
    assert e.value.param == "messages[0].content[0].source"


@pytest.mark.parametrize(
    "role,block",
    [
        ("user", {"type": "tool_use", "id": "t", "name": "f", "input": {}}),
        ("user", {"type": "thinking", "thinking": "x"}),
        ("assistant", {"type": "tool_result", "tool_use_id": "t", "content": "x"}),
    ],
)
def test_blocks_in_the_wrong_turn_are_a_400(role, block):
    with pytest.raises(InvalidRequest) as e:
        convo({"role": role, "content": [block]})
    assert e.value.param == "messages[0].content[0]"


# --- tools, thinking, sampling, stop reasons ---


def test_tools_become_functions_with_the_input_schema_as_parameters():
    _, tools = convo(
        *HI,
        tools=[
            {"name": "get_weather", "description": "Weather for a city", "input_schema": SCHEMA},
            {"name": "noop", "type": "custom", "input_schema": {"type": "object"}},
        ],
    )
    assert tools == [
        {
            "type": "function",
            "function": {"name": "get_weather", "description": "Weather for a city", "parameters": SCHEMA},
        },
        {"type": "function", "function": {"name": "noop", "description": "", "parameters": {"type": "object"}}},
    ]


def test_server_tools_are_left_out_of_the_prompt_and_named_on_the_turn():
    tools = [
        {"name": "f", "input_schema": SCHEMA},
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
    ]
    _, shown = convo(*HI, tools=tools)
    assert shown is not None and [t["function"]["name"] for t in shown] == ["f"]
    turn = tr.to_turn(req(messages=list(HI), tools=tools))
    assert [(h.kind, h.param) for h in turn.hosted] == [("web_search_20250305", "tools[1].type")]
    with pytest.raises(InvalidRequest) as e:
        convo(*HI, tools=[{"name": "g"}])
    assert e.value.param == "tools[0].input_schema"


@pytest.mark.parametrize(
    "thinking,kwargs",
    [
        (None, {}),
        ({"type": "enabled", "budget_tokens": 2048}, {"enable_thinking": True}),
        ({"type": "disabled"}, {"enable_thinking": False}),
        ({"type": "adaptive"}, {}),  # the model decides: the template's default
    ],
)
def test_thinking_switch(thinking, kwargs):
    assert tr.thinking_switch(req(thinking=thinking)) == kwargs


def test_sampling_request_maps_anthropic_names():
    r = req(max_tokens=64, temperature=0.2, top_p=0.9, top_k=40, stop_sequences=["\n\nHuman:", "END"])
    assert tr.sampling_request(r) == SamplingRequest(
        max_tokens=64, temperature=0.2, top_p=0.9, top_k=40, stop=("\n\nHuman:", "END")
    )
    assert tr.sampling_request(req()) == SamplingRequest(max_tokens=16)


def test_unsaid_sampling_takes_the_models_defaults():
    cfg = ModelConfig(model="builtin:tiny", max_tokens=100, max_request_tokens=500, default_temperature=0.3)
    p = resolve_sampling(
        tr.sampling_request(req(max_tokens=64000)), cfg, prompt_len=10, context_length=1000, vocab_size=50
    )
    assert p.temperature == 0.3 and p.max_tokens == 500 and p.stop == ()


@pytest.mark.parametrize(
    "finished,expected",
    [
        (Finished("stop", Usage(1, 2)), ("end_turn", None)),
        (Finished("length", Usage(1, 2)), ("max_tokens", None)),
        (Finished("stop", Usage(1, 2), stop_sequence="END"), ("stop_sequence", "END")),
        (Finished("tool_calls", Usage(1, 2)), ("tool_use", None)),
    ],
)
def test_stop_reason(finished, expected):
    assert tr.stop_reason(finished) == expected


def test_a_system_message_inside_messages_joins_the_user_turn_beside_it():
    # Claude Code sends mid-conversation instructions as {"role": "system"} messages.
    r = validate(
        CountTokensRequest,
        {
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "Say hi"}]},
                {"role": "system", "content": "Agents: Explore, Plan"},
                {"role": "assistant", "content": "hi"},
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "again"},
            ]
        },
    )
    assert tr.to_template_messages(r)[0] == [
        {"role": "user", "content": "Say hi\n\nAgents: Explore, Plan"},
        {"role": "assistant", "content": "hi"},
        {"role": "user", "content": "Be brief.\n\nagain"},
    ]


def test_tools_the_server_ran_are_replayed_as_the_turns_the_model_saw():
    # A response of the server-side tool loop, sent back as history: call, result, then the answer.
    messages, _ = convo(
        {"role": "user", "content": "add 2 and 3"},
        {
            "role": "assistant",
            "content": [
                {"type": "server_tool_use", "id": "srvtoolu_1", "name": "files__add", "input": {"a": 2, "b": 3}},
                {"type": "mcp_tool_result", "tool_use_id": "srvtoolu_1", "content": [{"type": "text", "text": "5"}]},
                {"type": "text", "text": "It is 5."},
            ],
        },
        {"role": "user", "content": "thanks"},
    )
    assert messages[1:] == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "srvtoolu_1",
                    "type": "function",
                    "function": {"name": "files__add", "arguments": {"a": 2, "b": 3}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "srvtoolu_1", "content": "5", "name": "files__add"},
        {"role": "assistant", "content": "It is 5."},
        {"role": "user", "content": "thanks"},
    ]


def test_server_tool_blocks_belong_in_assistant_turns():
    with pytest.raises(InvalidRequest, match="belong in assistant turns"):
        convo(
            {
                "role": "user",
                "content": [
                    {"type": "mcp_tool_result", "tool_use_id": "x", "content": [{"type": "text", "text": "5"}]}
                ],
            }
        )
