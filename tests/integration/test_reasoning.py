"""Reasoning apart from the answer, on a real worker: builtin:tiny has <think> and </think> as
whole tokens (as Qwen3 has), and a logit bias makes its random weights write them. Both API
families, streamed and not, must agree to the character."""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest

from tests.support.servers import start_serve

THINK, END_THINK = 49152, 49153  # builtin:tiny's <think> and </think>
# Sampled with a seed: the bias makes the model open a think block at once and close it soon.
SAMPLING = {"temperature": 1.0, "seed": 16, "logit_bias": {str(THINK): 10, str(END_THINK): 7}}
MESSAGES = [{"role": "user", "content": "Think, then answer."}]


@pytest.fixture(scope="module")
def server():
    s = start_serve("builtin:tiny", "--reasoning-parser", "qwen3", "--timeout", "60")
    yield s
    assert s.stop() == 0, s.log()[-3000:]


@pytest.fixture(scope="module")
def plain():
    """The same model with no parser: everything it writes is the answer, tags included."""
    s = start_serve("builtin:tiny", "--timeout", "60")
    yield s
    assert s.stop() == 0, s.log()[-3000:]


def openai_chat(server, extra: dict | None = None, **kw):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    return client.chat.completions.create(
        model="m", messages=MESSAGES, max_tokens=40, extra_body={**SAMPLING, **(extra or {})}, **kw
    )


def test_openai_returns_reasoning_apart_from_content_streamed_and_not(server, plain):
    whole = openai_chat(server).choices[0].message
    reasoning, content = whole.reasoning_content, whole.content
    assert reasoning and content, (reasoning, content)
    assert whole.model_extra["reasoning"] == reasoning  # the field newer clients read
    # What the model really wrote, seen through a worker without a parser:
    raw = openai_chat(plain).choices[0].message.content
    assert raw.startswith("<think>") and "</think>" in raw
    assert reasoning == raw[len("<think>") : raw.index("</think>")].strip()
    assert content == raw[raw.index("</think>") + len("</think>") :].strip()
    # Streamed: reasoning deltas first, then content deltas, adding up to the same.
    kinds, got = [], {"reasoning": "", "content": ""}
    for chunk in openai_chat(server, stream=True):
        delta = chunk.choices[0].delta if chunk.choices else None
        for kind, text in (
            ("reasoning", getattr(delta, "reasoning_content", None)),
            ("content", delta and delta.content),
        ):
            if text:
                got[kind] += text
                if not kinds or kinds[-1] != kind:
                    kinds.append(kind)
    assert got == {"reasoning": reasoning, "content": content} and kinds == ["reasoning", "content"]


def test_anthropic_returns_thinking_blocks_identical_to_openai(server):
    expected = openai_chat(server).choices[0].message
    client = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
    body = dict(model="m", max_tokens=40, messages=MESSAGES, extra_body=SAMPLING)
    m = client.messages.create(**body)
    assert [b.type for b in m.content] == ["thinking", "text"]
    assert m.content[0].thinking == expected.reasoning_content and m.content[1].text == expected.content
    with client.messages.stream(**body) as stream:
        final = stream.get_final_message()
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in final.content] == [
        ("thinking", expected.reasoning_content),
        ("text", expected.content),
    ]


def test_thinking_switched_off_by_the_request_is_all_answer(server):
    off = openai_chat(server, {"chat_template_kwargs": {"enable_thinking": False}})
    assert not getattr(off.choices[0].message, "reasoning_content", None)
    client = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
    m = client.messages.create(
        model="m", max_tokens=20, messages=MESSAGES, thinking={"type": "disabled"}, extra_body=SAMPLING
    )
    assert [b.type for b in m.content] == ["text"]


def test_a_raw_completion_is_all_answer(server):
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "<think>", "max_tokens": 10, **SAMPLING}).json()
    assert "reasoning_content" not in json.dumps(r) and r["choices"][0]["text"]


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {
                "type": "object",
                "properties": {"zone": {"type": "string", "maxLength": 6}},
                "required": ["zone"],
                "additionalProperties": False,
            },
        },
    }
]


def test_reasoning_then_a_forced_call_streamed_and_not(server):
    """The model thinks freely, then the grammar holds its call: both paths parse both."""
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    kw = dict(
        model="m",
        messages=MESSAGES,
        max_tokens=80,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        extra_body=SAMPLING,
    )
    whole = client.chat.completions.create(**kw).choices[0]
    assert whole.message.reasoning_content and whole.finish_reason == "tool_calls"
    [call] = whole.message.tool_calls
    assert call.function.name == "get_time" and set(json.loads(call.function.arguments)) == {"zone"}
    reasoning, calls = "", {}
    for chunk in client.chat.completions.create(stream=True, **kw):
        delta = chunk.choices[0].delta if chunk.choices else None
        reasoning += (delta and getattr(delta, "reasoning_content", None)) or ""
        for d in (delta and delta.tool_calls) or []:
            calls.setdefault(d.index, {"name": None, "arguments": ""})
            calls[d.index]["name"] = (d.function and d.function.name) or calls[d.index]["name"]
            calls[d.index]["arguments"] += (d.function and d.function.arguments) or ""
    assert reasoning == whole.message.reasoning_content
    assert list(calls.values()) == [{"name": "get_time", "arguments": call.function.arguments}]


def test_the_responses_api_gives_reasoning_items_equal_to_chats_streamed_and_not(server):
    """The same seed on /v1/responses: a reasoning item (its text a summary) before the message,
    equal to what chat completions split; streamed, the reasoning summary events come first."""
    expected = openai_chat(server).choices[0].message
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    kw = dict(model="m", input=MESSAGES, max_output_tokens=40, reasoning={"effort": "low"}, extra_body=SAMPLING)
    made = client.responses.create(**kw)
    assert [item.type for item in made.output] == ["reasoning", "message"]
    assert made.output[0].summary[0].text == expected.reasoning_content
    assert made.output_text == expected.content
    with client.responses.stream(**kw) as stream:
        events = list(stream)
    kinds = [e.type for e in events]
    thought = "".join(e.delta for e in events if e.type == "response.reasoning_summary_text.delta")
    said = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert (thought, said) == (expected.reasoning_content, expected.content)
    assert kinds.index("response.reasoning_summary_text.done") < kinds.index("response.output_text.delta")
    assert events[-1].response.output[0].summary[0].text == expected.reasoning_content
