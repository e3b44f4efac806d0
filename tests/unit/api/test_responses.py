"""The Responses API's pure parts: input items as chat messages, tools, formats, and the store."""

from __future__ import annotations

import pytest

from vllmmlxd.api.hosted_tools import HostedTool, enforce, header_value
from vllmmlxd.api.responses import translate as tr
from vllmmlxd.api.responses.protocol import ResponsesRequest
from vllmmlxd.api.responses.store import ResponseStore, as_input, with_ids
from vllmmlxd.errors import InvalidRequest

TOOL = {"type": "function", "name": "w", "parameters": {"type": "object"}}


def turn(**fields):
    return tr.to_turn(ResponsesRequest.model_validate({"input": "Hi", **fields}))


def test_instructions_input_calls_and_outputs_become_the_chat_conversation():
    t = turn(
        instructions="Be brief.",
        input=[
            {
                "role": "user",
                "content": [{"type": "input_text", "text": "Weather in "}, {"type": "input_text", "text": "Paris?"}],
            },
            {"type": "function_call", "call_id": "c1", "name": "w", "arguments": '{"city": "Paris"}'},
            {"type": "function_call", "call_id": "c2", "name": "w", "arguments": '{"city": "Lyon"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "Sunny"},
            {"type": "reasoning", "summary": []},
        ],
    )
    roles = [m["role"] for m in t.prompt.messages]
    assert roles == ["system", "user", "assistant", "tool"]
    assert t.prompt.messages[1]["content"] == "Weather in Paris?"
    assert [c["id"] for c in t.prompt.messages[2]["tool_calls"]] == ["c1", "c2"]  # one assistant turn
    assert t.id_prefix == "resp_"


def test_flat_function_tools_become_chat_tools_and_a_named_choice_is_held():
    t = turn(
        tools=[{"type": "function", "name": "w", "parameters": {"type": "object"}}],
        tool_choice={"type": "function", "name": "w"},
    )
    assert t.prompt.tools == [{"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}]
    assert (t.tool_choice.mode, t.tool_choice.name) == ("named", "w")


def test_text_format_and_sampling_carry_over():
    t = turn(
        text={
            "format": {
                "type": "json_schema",
                "name": "x",
                "strict": True,
                "schema": {"type": "object", "properties": {}},
            }
        },
        max_output_tokens=7,
        temperature=0,
        stop="END",
    )
    assert t.output is not None and t.output.schema["additionalProperties"] is False
    assert (t.sampling.max_tokens, t.sampling.temperature, t.sampling.stop) == (7, 0, ("END",))


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"tools": [{"type": "custom", "name": "patch"}]}, "tools[0].type"),
        ({"tools": [{"type": "function"}]}, "tools[0]"),
        ({"tool_choice": {"type": "web_search"}}, "tool_choice"),
        ({"input": []}, "input"),
        ({"input": [{"type": "message", "role": "robot", "content": "x"}]}, "input[0].role"),
        ({"input": [{"type": "function_call", "name": "w"}]}, "input[0].call_id"),
        ({"text": {"format": {"type": "json_schema"}}}, "text.format.schema"),
        ({"background": True}, "background"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt"),
        ({"tools": [{"type": "web_search"}], "tool_choice": {"type": "web_search"}}, "tool_choice"),
    ],
)
def test_what_cannot_be_served_is_refused_naming_it(fields, param):
    with pytest.raises(InvalidRequest) as err:
        turn(**fields)
    assert err.value.param == param


@pytest.mark.parametrize("kind", sorted(tr.HOSTED_TOOLS))
def test_hosted_tools_are_left_out_of_the_prompt_and_named_or_refused(kind):
    t = turn(tools=[{"type": kind}, TOOL, {"type": kind, "x": 1}])
    assert t.prompt.tools is not None and [f["function"]["name"] for f in t.prompt.tools] == [TOOL["name"]]
    assert t.hosted == (HostedTool(kind, "tools[0].type"), HostedTool(kind, "tools[2].type"))
    assert header_value(t.hosted) == kind
    enforce("ignore", t.hosted)
    with pytest.raises(InvalidRequest) as err:
        enforce("refuse", t.hosted)
    assert err.value.param == "tools[0].type" and kind in err.value.message


def test_the_store_keeps_each_keys_responses_apart_and_stays_in_its_bounds():
    store = ResponseStore(max_responses=2)
    for n in range(3):
        store.put("alice", {"id": f"resp_{n}", "output": []}, [])
    assert store.get("alice", "resp_0") is None and store.get("alice", "resp_2") is not None  # oldest out
    assert store.get("bob", "resp_2") is None and store.get(None, "resp_2") is None  # another key: not found
    assert not store.delete("bob", "resp_2") and store.delete("alice", "resp_2")
    tiny = ResponseStore(max_bytes=100)
    tiny.put(None, {"id": "resp_big", "output": ["x" * 200]}, [])
    assert len(tiny) == 0 and tiny.nbytes == 0


def test_earlier_output_becomes_the_next_turns_input():
    message = {
        "type": "message",
        "content": [{"type": "output_text", "text": "Hi "}, {"type": "output_text", "text": "Ada"}],
    }
    assert as_input(message) == {"type": "message", "role": "assistant", "content": "Hi Ada"}
    call = {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "c",
        "name": "w",
        "arguments": "{}",
        "status": "completed",
    }
    assert as_input(call) == {"type": "function_call", "call_id": "c", "name": "w", "arguments": "{}"}
    assert as_input({"type": "reasoning", "summary": []}) is None
    listed = with_ids("resp_abc", [{"type": "message", "role": "user", "content": "x"}])
    assert listed[0]["id"] == "in_abc_0" and listed[0]["content"] == [{"type": "input_text", "text": "x"}]


def test_a_response_id_names_the_model_that_made_it_and_is_the_server_s_own():
    from vllmmlxd.api.responses.ids import id_prefix, response_id, response_tag, tag_of

    made = response_id("tiny")
    assert made.startswith(id_prefix("tiny")) and len(made) == len(id_prefix("tiny")) + 32
    assert len({response_id("tiny") for _ in range(100)}) == 100  # 128 random bits each
    assert tag_of(made) == response_tag("tiny") != response_tag("other")
    assert tag_of("resp_short") is None and tag_of("chatcmpl-1") is None


def test_a_put_never_replaces_what_another_key_stored_and_the_bytes_add_up():
    from vllmmlxd.api.responses.store import ResponseStore

    store = ResponseStore(max_responses=10, max_bytes=10_000)
    assert store.put("alice", {"id": "resp_1", "output": ["mine"]}, [])
    held = store.nbytes
    assert not store.put("bob", {"id": "resp_1", "output": ["theirs"]}, [])
    assert store.get("alice", "resp_1").response["output"] == ["mine"] and store.get("bob", "resp_1") is None
    assert store.nbytes == held
    for _ in range(50):  # replacing one's own entry again and again leaks no bytes
        assert store.put("alice", {"id": "resp_1", "output": ["again"]}, [])
    assert store.nbytes == held + len('"again"') - len('"mine"') and len(store) == 1


NAMESPACE = {
    "type": "namespace",
    "name": "agents",
    "description": "Sub-agents.",
    "tools": [{"type": "function", "name": "spawn", "description": "Start one.", "parameters": {"type": "object"}}],
}


def test_a_namespaces_tools_are_offered_by_their_joined_name_and_its_calls_written_back_apart():
    from vllmmlxd.api.responses.encode import ResponseShape
    from vllmmlxd.engine.types import ToolCallDelta

    req = ResponsesRequest.model_validate(
        {
            "input": [
                {"type": "function_call", "call_id": "c1", "namespace": "agents", "name": "spawn", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "ok"},
            ],
            "tools": [NAMESPACE, {"type": "function", "name": "w"}],
        }
    )
    t = tr.to_turn(req)
    [spawn, w] = t.prompt.tools
    assert spawn["function"]["name"] == "agents.spawn" and spawn["function"]["description"] == "Sub-agents. Start one."
    assert w["function"]["name"] == "w"
    assert t.prompt.messages[0]["tool_calls"][0]["function"]["name"] == "agents.spawn"  # an earlier call, as offered
    shape = ResponseShape(req, "m")
    called = shape.call("fc_1", "resp_1", ToolCallDelta(0, "agents.spawn", "{}"))
    assert (called["namespace"], called["name"]) == ("agents", "spawn")
    assert "namespace" not in shape.call("fc_2", "resp_1", ToolCallDelta(1, "w", "{}"))
    assert as_input(called)["namespace"] == "agents"  # and so back into the next turn
    with pytest.raises(InvalidRequest) as err:
        turn(tools=[{**NAMESPACE, "tools": [{"type": "custom", "name": "patch"}]}])
    assert err.value.param == "tools[0].tools[0].type"


def test_include_takes_encrypted_reasoning_and_logprobs_and_refuses_the_rest_naming_what_it_takes():
    from vllmmlxd.api.responses.encode import ResponseShape

    sealed = ResponsesRequest.model_validate({"input": "Hi", "include": ["reasoning.encrypted_content"]})
    tr.to_turn(sealed)
    item = ResponseShape(sealed, "m").reasoning("rs_1", "thought")
    assert item["encrypted_content"] and item["summary"][0]["text"] == "thought"
    assert "encrypted_content" not in ResponseShape(ResponsesRequest(input="Hi"), "m").reasoning("rs_1", "thought")
    assert turn(include=["message.output_text.logprobs"], top_logprobs=3).sampling.logprobs == 3
    assert turn(include=["message.output_text.logprobs"]).sampling.logprobs == 0
    assert turn(top_logprobs=2).sampling.logprobs == 2 and turn().sampling.logprobs is None
    with pytest.raises(InvalidRequest) as err:
        turn(include=["file_search_call.results"])
    assert err.value.param == "include" and "reasoning.encrypted_content" in str(err.value)


def test_the_sampling_extensions_of_chat_completions_carry_over():
    t = turn(top_k=5, min_p=0.1, repetition_penalty=1.1, logit_bias={"7": 3}, reasoning={"effort": "xhigh"})
    assert (t.sampling.top_k, t.sampling.min_p, t.sampling.repetition_penalty) == (5, 0.1, 1.1)
    assert t.sampling.logit_bias == {"7": 3}


def test_the_oldest_turns_go_first_and_the_system_messages_stay():
    from vllmmlxd.api.turn import turn_starts, without_oldest

    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "1"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]},
        {"role": "tool", "tool_call_id": "c", "content": "r"},
        {"role": "user", "content": "2"},
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "3"},
    ]
    starts = turn_starts(messages)
    assert starts == [1, 4, 6]  # a call and its result stay in their turn
    assert without_oldest(messages, starts, 0) == messages
    assert [m["content"] for m in without_oldest(messages, starts, 1)] == ["s", "2", "a", "3"]
    assert [m["content"] for m in without_oldest(messages, starts, 2)] == ["s", "3"]


def test_new_bounds_apply_at_once_and_zero_keeps_none():
    store = ResponseStore()
    for n in range(4):
        store.put("k", {"id": f"resp_{n}", "output": []}, [])
    store.bound(2, store.max_bytes)
    assert len(store) == 2 and store.get("k", "resp_3") is not None and store.get("k", "resp_1") is None
    store.bound(0, store.max_bytes)
    store.put("k", {"id": "resp_9", "output": []}, [])
    assert len(store) == 0 and store.nbytes == 0


def test_a_client_is_told_a_model_s_name_never_the_operator_s_path():
    from vllmmlxd.api.context import shown_source

    assert shown_source("builtin:tiny") == "builtin:tiny" and shown_source("Qwen/Qwen3-0.6B") == "Qwen/Qwen3-0.6B"
    assert shown_source("/home/op/.local/state/vllmmlxd/models/hub-mlx-community--Qwen3-0.6B-4bit") == (
        "mlx-community/Qwen3-0.6B-4bit"
    )
    assert shown_source("/srv/models/my-llama") == "my-llama" and shown_source("~/m/llama.gguf") == "llama.gguf"
    assert shown_source("./models/x/") == "x" and shown_source("/s/models/builtin-tiny-v3") == "builtin:tiny"
