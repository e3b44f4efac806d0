"""Unit tests of the pure OpenAI translation code (fakes are fine here)."""

import json

import pytest

from vllmmlxd.api.body import validate
from vllmmlxd.api.openai import encode
from vllmmlxd.api.openai import translate as tr
from vllmmlxd.api.openai.protocol import ChatCompletionRequest, CompletionRequest
from vllmmlxd.api.sampling import resolve_sampling
from vllmmlxd.api.stream import Folded
from vllmmlxd.config.schema import ModelConfig
from vllmmlxd.engine.types import Finished, ReasoningDelta, TextDelta, Usage
from vllmmlxd.errors import ContextLengthExceeded, InvalidRequest, UnprocessableBody

CFG = ModelConfig(model="builtin:tiny", max_tokens=100, max_request_tokens=500, default_temperature=0.3)


def chat(**kw):
    return ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], **kw})


def resolve(req, prompt_len=10, ctx=1000, vocab=50):
    return resolve_sampling(tr.sampling_request(req), CFG, prompt_len=prompt_len, context_length=ctx, vocab_size=vocab)


def test_defaults_come_from_the_model_config():
    p = resolve(chat())
    assert p.temperature == 0.3 and p.top_p == 1.0 and p.max_tokens == 100


def test_request_values_win():
    p = resolve(chat(temperature=0, top_p=0.5, max_tokens=7, stop="x", seed=3, logit_bias={"5": -100}))
    assert (p.temperature, p.top_p, p.max_tokens, p.stop, p.seed) == (0, 0.5, 7, ("x",), 3)
    assert p.logit_bias == ((5, -100.0),)


def test_max_completion_tokens_is_honoured():
    assert resolve(chat(max_completion_tokens=9)).max_tokens == 9


def test_default_max_tokens_is_clamped_to_the_room_left():
    assert resolve(chat(), prompt_len=950).max_tokens == 50


def test_prompt_over_the_context_is_a_400():
    with pytest.raises(ContextLengthExceeded) as e:
        resolve(chat(), prompt_len=1000)
    assert e.value.status_code == 400 and e.value.code == "context_length_exceeded"


def test_asking_more_than_the_room_left_is_clamped_to_it():
    assert resolve(chat(max_tokens=200), prompt_len=900).max_tokens == 100


def test_max_tokens_above_the_server_cap_is_clamped_to_it():
    # Agents ask for 32k-64k by default; the finish reason tells them when the cap ended it.
    assert resolve(chat(max_tokens=64000)).max_tokens == 500


def test_a_default_max_tokens_is_lowered_to_what_the_kv_budget_holds():
    # The engine refuses what could never fit its KV budget; a request that asked for nothing is
    # given what fits instead, never refused for the entry's own default.
    kv = lambda req, prompt_len=10: resolve_sampling(  # noqa: E731
        tr.sampling_request(req), CFG, prompt_len=prompt_len, context_length=1000, vocab_size=50, kv_tokens=60
    )
    assert kv(chat()).max_tokens == 50
    assert kv(chat(max_tokens=7)).max_tokens == 7
    assert kv(chat(max_tokens=90)).max_tokens == 90  # asked for: left for the engine's 400, with the numbers
    assert kv(chat(), prompt_len=70).max_tokens == 100  # the prompt alone does not fit: the engine's 400 too


def test_logit_bias_outside_vocab_is_a_400():
    with pytest.raises(InvalidRequest, match="vocabulary"):
        resolve(chat(logit_bias={"50": 1}))


@pytest.mark.parametrize(
    "body,param",
    [
        ({"max_tokens": -1}, "max_tokens"),
        ({"max_tokens": "many"}, "max_tokens"),
        ({"temperature": 3}, "temperature"),
        ({"n": 129}, "n"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
        ({"logit_bias": {"a": 1}}, "logit_bias"),
        ({"stop": ["x"] * 17}, "stop"),
    ],
)
def test_bad_parameters_are_400_naming_the_field(body, param):
    with pytest.raises(InvalidRequest) as e:
        validate(ChatCompletionRequest, {"messages": [{"role": "user", "content": "hi"}], **body})
    assert e.value.status_code == 400 and e.value.param == param


def test_missing_field_is_422():
    with pytest.raises(UnprocessableBody) as e:
        validate(ChatCompletionRequest, {})
    assert e.value.status_code == 422 and e.value.param == "messages"


def test_unknown_fields_are_allowed():
    assert validate(ChatCompletionRequest, {"messages": [{"role": "user", "content": "x"}], "foo": 1})


def test_content_parts_are_joined_and_images_are_parts_in_their_place():
    msgs = chat(
        messages=[{"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    ).messages
    assert tr.to_template_messages(msgs) == [{"role": "system", "content": "ab"}]
    parts = [
        {"type": "text", "text": "a"},
        {"type": "text", "text": "b"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}},
        {"type": "image_url", "image_url": "https://example.com/x.png"},  # the URL as a plain string
    ]
    [user] = tr.to_template_messages(chat(messages=[{"role": "user", "content": parts}]).messages)
    assert [p["type"] for p in user["content"]] == ["text", "image", "image"] and user["content"][0]["text"] == "ab"
    first, second = user["content"][1]["image"], user["content"][2]["image"]
    assert (first.where, first.url) == ("messages[0].content[2]", "data:image/png;base64,AAAA")
    assert second.url == "https://example.com/x.png"
    for bad in ({"url": ""}, None, {"detail": "low"}):
        bad_msgs = chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": bad}]}]).messages
        with pytest.raises(InvalidRequest, match="must be a data: or http"):
            tr.to_template_messages(bad_msgs)
    audio = chat(messages=[{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]).messages
    with pytest.raises(InvalidRequest, match="input_audio"):
        tr.to_template_messages(audio)


def test_tool_call_arguments_are_parsed_for_the_template():
    msgs = chat(
        messages=[
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}],
            }
        ]
    ).messages
    out = tr.to_template_messages(msgs)[0]
    assert out["tool_calls"][0]["function"]["arguments"] == {"a": 1} and out["content"] == ""


@pytest.mark.parametrize(
    "field,value",
    [
        ("best_of", 3),
        ("modalities", ["audio"]),
        ("audio", {"voice": "x"}),
    ],
)
def test_fields_this_server_would_not_honour_are_refused_naming_them(field, value):
    req = chat(**{field: value})
    with pytest.raises(InvalidRequest) as e:
        tr.refuse_unhonoured(req)
    assert e.value.param == field


def test_logprobs_asked_become_the_number_of_top_candidates():
    assert tr.sampling_request(CompletionRequest(prompt="a", logprobs=0)).logprobs == 0  # 0 still asks: the token's own
    assert tr.sampling_request(CompletionRequest(prompt="a")).logprobs is None
    assert tr.sampling_request(chat(logprobs=True, top_logprobs=4)).logprobs == 4
    assert tr.sampling_request(chat(logprobs=True)).logprobs == 0
    assert tr.sampling_request(chat(logprobs=False)).logprobs is None
    with pytest.raises(InvalidRequest) as e:
        tr.sampling_request(chat(top_logprobs=2))
    assert e.value.param == "top_logprobs"
    for ok in ({"logprobs": None}, {"best_of": 1}, {"echo": False}):
        tr.refuse_unhonoured(CompletionRequest(prompt="a", **ok))
    tr.refuse_unhonoured(chat(logprobs=False, response_format={"type": "text"}))


def test_completion_prompt_forms():
    assert tr.completion_prompt(CompletionRequest(prompt="a")) == "a"
    assert tr.completion_prompt(CompletionRequest(prompt=["a"])) == "a"
    assert tr.completion_prompt(CompletionRequest(prompt=[1, 2])) == [1, 2]
    with pytest.raises(InvalidRequest):
        tr.completion_prompt(CompletionRequest(prompt=["a", "b"]))
    with pytest.raises(InvalidRequest):
        tr.completion_prompt(CompletionRequest(prompt=""))


def fold(events):
    f = Folded()
    for ev in events:
        f.add(ev)
    return f


def frames_json(frames):
    return [json.loads(f[6:]) for f in frames if f.startswith("data: {")]


def test_fold_and_response_shapes_agree():
    f = fold([TextDelta("Hel"), TextDelta("lo"), Finished("length", Usage(3, 2))])
    body = encode.chat_response("id1", 1, "m", f)
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "Hello"}
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 2,
        "total_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 0},
        "completion_tokens_details": {"accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0},
    }
    assert encode.completion_response("id2", 1, "m", f)["choices"][0]["text"] == "Hello"


def test_reasoning_is_apart_from_the_answer_in_both_paths():
    events = [ReasoningDelta("think "), ReasoningDelta("hard"), TextDelta("Paris"), Finished("stop", Usage(3, 5))]
    message = encode.chat_response("id", 1, "m", fold(events))["choices"][0]["message"]
    assert message == {
        "role": "assistant",
        "content": "Paris",
        "reasoning_content": "think hard",
        "reasoning": "think hard",
    }
    enc = encode.ChatStreamEncoder("id", 1, "m", include_usage=True)
    chunks = frames_json(enc.start() + [f for e in events for f in enc.event(e)])
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert "".join(d.get("reasoning_content", "") for d in deltas) == message["reasoning_content"]
    assert "".join(d.get("content", "") for d in deltas) == message["content"]
    assert chunks[-1]["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 5,
        "total_tokens": 8,
        "prompt_tokens_details": {"cached_tokens": 0},
        "completion_tokens_details": {"accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0},
    }
    assert enc.end() == ["data: [DONE]\n\n"]


def test_calls_the_server_ran_are_replayed_before_the_answer_they_led_to():
    req = chat(
        messages=[
            {"role": "user", "content": "add 2 and 3"},
            {
                "role": "assistant",
                "content": "It is 5.",
                "mcp_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "files__add", "arguments": '{"a": 2, "b": 3}'},
                        "result": {"content": [{"type": "text", "text": "5"}], "is_error": False},
                    },
                    {
                        "id": "call_2",
                        "type": "function",
                        "function": {"name": "files__fail", "arguments": "{}"},
                        "result": {"content": [{"type": "text", "text": "boom"}], "is_error": True},
                    },
                    "not a call",
                ],
            },
        ]
    )
    assert tr.to_template_messages(req.messages)[1:] == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "files__add", "arguments": {"a": 2, "b": 3}}},
                {"id": "call_2", "type": "function", "function": {"name": "files__fail", "arguments": {}}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "name": "files__add", "content": "5"},
        {"role": "tool", "tool_call_id": "call_2", "name": "files__fail", "content": "Error: boom"},
        {"role": "assistant", "content": "It is 5."},
    ]


def test_chat_web_search_options_is_a_hosted_tool_and_the_deprecated_functions_are_refused():
    turn = tr.to_turn(chat(web_search_options={}))
    assert [(h.kind, h.param) for h in turn.hosted] == [("web_search_options", "web_search_options")]
    assert tr.to_turn(chat()).hosted == ()
    for field, value in (("functions", [{"name": "f"}]), ("function_call", "auto")):
        with pytest.raises(InvalidRequest) as e:
            tr.refuse_unhonoured(chat(**{field: value}))
        assert e.value.param == field
