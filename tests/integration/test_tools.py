"""Tool calls and structured output on a real worker (builtin:tiny, random weights), through
both API families with the official SDKs: a forced call or a schema holds even a model that
writes noise, because decoding is constrained and the same parser reads the result back."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import jsonschema
import openai
import pytest

from tests.support.servers import start_serve

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"zone": {"type": "string", "maxLength": 8}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather in a city", "parameters": WEATHER},
    },
    {"type": "function", "function": {"name": "get_time", "description": "Time in a zone", "parameters": TIME}},
]
SCHEMAS = {n: t["function"]["parameters"] for n, t in [(t["function"]["name"], t) for t in TOOLS]}
ANTHROPIC_TOOLS = [
    {
        "name": t["function"]["name"],
        "description": t["function"]["description"],
        "input_schema": t["function"]["parameters"],
    }
    for t in TOOLS
]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
SAMPLING = {"temperature": 1.0, "seed": 3}
# A random model never chooses to stop: once a call is complete it would start another, as
# parallel calls allow, until max_tokens. One call is what these tests ask of it.


@pytest.fixture(scope="module")
def server():
    s = start_serve("builtin:tiny", "--timeout", "120")
    yield s
    assert s.stop() == 0, s.log()[-3000:]


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def ant(server):
    return anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0, timeout=120)


def assert_valid_call(name: str, arguments: str | dict, allowed=("get_weather", "get_time")):
    assert name in allowed
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    jsonschema.validate(args, SCHEMAS[name])
    return args


def streamed_openai_calls(stream) -> tuple[dict[int, dict], str | None]:
    calls: dict[int, dict] = {}
    finish = None
    for chunk in stream:
        choice = chunk.choices[0] if chunk.choices else None
        if choice is None:
            continue
        finish = choice.finish_reason or finish
        for d in choice.delta.tool_calls or []:
            call = calls.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
            call["id"] = d.id or call["id"]
            if d.function and d.function.name:
                call["name"] = d.function.name
            if d.function and d.function.arguments:
                call["arguments"] += d.function.arguments
    return calls, finish


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_openai_forced_call_is_well_formed_streamed_and_not(oai, choice):
    allowed = ("get_time",) if isinstance(choice, dict) else ("get_weather", "get_time")
    r = oai.chat.completions.create(
        model="m",
        messages=ASK,
        tools=TOOLS,
        tool_choice=choice,
        max_tokens=120,
        parallel_tool_calls=False,
        extra_body=SAMPLING,
    )
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and msg.tool_calls, msg
    for call in msg.tool_calls:
        assert call.id.startswith("call_") and call.type == "function"
        assert_valid_call(call.function.name, call.function.arguments, allowed)
    calls, finish = streamed_openai_calls(
        oai.chat.completions.create(
            model="m",
            messages=ASK,
            tools=TOOLS,
            tool_choice=choice,
            max_tokens=120,
            stream=True,
            parallel_tool_calls=False,
            extra_body=SAMPLING,
        )
    )
    assert finish == "tool_calls"
    # The same seed: the stream's calls are the whole response's (each with its own id).
    assert all(c["id"].startswith("call_") for c in calls.values())
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [
        (c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls
    ]


@pytest.mark.parametrize(
    "choice", [{"type": "any", "disable_parallel_tool_use": True}, {"type": "tool", "name": "get_weather"}]
)
def test_anthropic_forced_tool_use_is_well_formed_streamed_and_not(ant, choice):
    allowed = ("get_weather",) if choice["type"] == "tool" else ("get_weather", "get_time")
    body = dict(model="m", max_tokens=120, messages=ASK, tools=ANTHROPIC_TOOLS, tool_choice=choice, extra_body=SAMPLING)
    m = ant.messages.create(**body)
    uses = [b for b in m.content if b.type == "tool_use"]
    assert m.stop_reason == "tool_use" and uses, m
    for block in uses:
        assert block.id.startswith("toolu_")
        assert_valid_call(block.name, block.input, allowed)
    with ant.messages.stream(**body) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    assert [(b.name, b.input) for b in final.content if b.type == "tool_use"] == [(b.name, b.input) for b in uses]


def test_tool_choice_none_keeps_the_prompt_and_produces_no_call(oai, ant, server):
    base = dict(model="m", messages=ASK, max_tokens=5, extra_body=SAMPLING)
    none = oai.chat.completions.create(tools=TOOLS, tool_choice="none", **base)
    auto = oai.chat.completions.create(tools=TOOLS, tool_choice="auto", **base)
    plain = oai.chat.completions.create(**base)
    assert none.choices[0].message.tool_calls is None and none.choices[0].finish_reason != "tool_calls"
    # The tools stay in the prompt, as both providers do, so token counts agree across modes.
    assert none.usage.prompt_tokens == auto.usage.prompt_tokens > plain.usage.prompt_tokens
    m = ant.messages.create(
        model="m", max_tokens=5, messages=ASK, tools=ANTHROPIC_TOOLS, tool_choice={"type": "none"}, extra_body=SAMPLING
    )
    assert all(b.type == "text" for b in m.content) and m.stop_reason != "tool_use"


def test_a_tool_conversation_round_trips_through_openai(oai):
    first = oai.chat.completions.create(
        model="m",
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        max_tokens=120,
        parallel_tool_calls=False,
        extra_body=SAMPLING,
    )
    call = first.choices[0].message.tool_calls[0]
    history = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 21})},
    ]
    answer = oai.chat.completions.create(model="m", messages=history, tools=TOOLS, max_tokens=8, extra_body=SAMPLING)
    # The result is in the prompt the model answered: the call, then its output.
    assert answer.usage.prompt_tokens > first.usage.prompt_tokens and answer.choices[0].finish_reason in (
        "stop",
        "length",
        "tool_calls",
    )


def test_a_tool_conversation_round_trips_through_anthropic(ant):
    first = ant.messages.create(
        model="m",
        max_tokens=120,
        messages=ASK,
        tools=ANTHROPIC_TOOLS,
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        extra_body=SAMPLING,
    )
    [use] = [b for b in first.content if b.type == "tool_use"]
    history = [
        *ASK,
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "21 degrees", "is_error": False}],
        },
    ]
    answer = ant.messages.create(model="m", max_tokens=8, messages=history, tools=ANTHROPIC_TOOLS, extra_body=SAMPLING)
    assert answer.usage.input_tokens > first.usage.input_tokens and answer.stop_reason in (
        "end_turn",
        "max_tokens",
        "tool_use",
    )
    counted = ant.messages.count_tokens(model="m", messages=history, tools=ANTHROPIC_TOOLS)
    assert counted.input_tokens == answer.usage.input_tokens


STRUCTURED = {
    "string array": {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "minItems": 1, "maxItems": 4}
        },
        "required": ["tags"],
        "additionalProperties": False,
    },
    "nested enums and bounded integers": {
        "type": "object",
        "properties": {
            "person": {
                "type": "object",
                "properties": {
                    "role": {"enum": ["admin", "user", "guest"]},
                    "age": {"type": "integer", "minimum": 0, "maximum": 120},
                    "address": {
                        "type": "object",
                        "properties": {"zip": {"type": "integer", "minimum": 1000, "maximum": 99999}},
                        "required": ["zip"],
                        "additionalProperties": False,
                    },
                },
                "required": ["role", "age", "address"],
                "additionalProperties": False,
            }
        },
        "required": ["person"],
        "additionalProperties": False,
    },
    "array of objects": {
        "type": "array",
        "minItems": 1,
        "maxItems": 3,
        "items": {
            "type": "object",
            "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 9}, "ok": {"type": "boolean"}},
            "required": ["id", "ok"],
            "additionalProperties": False,
        },
    },
}


@pytest.mark.parametrize("name", STRUCTURED)
def test_structured_output_validates_streamed_and_not(oai, name):
    schema = STRUCTURED[name]
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}
    for seed in (1, 2):
        kw = dict(
            model="m",
            messages=[{"role": "user", "content": "Answer in JSON."}],
            max_tokens=200,
            response_format=fmt,
            extra_body={"temperature": 1.0, "seed": seed},
        )
        r = oai.chat.completions.create(**kw)
        assert r.choices[0].finish_reason == "stop", r
        jsonschema.validate(json.loads(r.choices[0].message.content), schema)
        streamed = "".join(
            c.choices[0].delta.content or "" for c in oai.chat.completions.create(stream=True, **kw) if c.choices
        )
        assert streamed == r.choices[0].message.content


def test_json_object_mode_gives_an_object(oai):
    r = oai.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "JSON please"}],
        max_tokens=200,
        response_format={"type": "json_object"},
        extra_body={"temperature": 1.0, "seed": 5},
    )
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:  # a free-form object may run out of tokens; what was written is still an object's start
        assert r.choices[0].message.content.startswith("{")


def test_anthropic_output_format_is_enforced(ant):
    schema = STRUCTURED["nested enums and bounded integers"]
    m = ant.messages.create(
        model="m",
        max_tokens=200,
        messages=[{"role": "user", "content": "JSON"}],
        extra_body={"output_format": {"type": "json_schema", "schema": schema}, **SAMPLING},
    )
    jsonschema.validate(json.loads(m.content[0].text), schema)


def test_bad_schemas_and_choices_are_400s_naming_the_field(server):
    url = server.url + "/v1/chat/completions"
    base = {"messages": ASK, "max_tokens": 5}
    cases = [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
            "response_format.json_schema.schema",
        ),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "rm_rf"}}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
    ]
    deep: dict = {"type": "object"}
    for _ in range(40):
        deep = {"type": "object", "properties": {"a": deep}}
    cases.append(
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": deep}}},
            "response_format.json_schema.schema",
        )
    )
    for extra, param in cases:
        r = httpx.post(url, json={**base, **extra}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (extra, r.text)
    r = httpx.post(
        server.url + "/v1/messages",
        json={
            "max_tokens": 5,
            "messages": ASK,
            "tools": ANTHROPIC_TOOLS,
            "tool_choice": {"type": "tool", "name": "nope"},
        },
    )
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert httpx.get(server.url + "/health").status_code == 200


def test_a_forced_call_cut_by_max_tokens_is_a_partial_call_in_both_families(oai, ant):
    # Held to the call format, every token is the call's, and the shortest whole call takes more than 16.
    choice = {"type": "function", "function": {"name": "get_weather"}}
    r = oai.chat.completions.create(
        model="m", messages=ASK, tools=TOOLS, tool_choice=choice, max_tokens=16, extra_body=SAMPLING
    )
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "length" and msg.content is None
    assert [c.function.name for c in msg.tool_calls] == ["get_weather"]
    calls, finish = streamed_openai_calls(
        oai.chat.completions.create(
            model="m", messages=ASK, tools=TOOLS, tool_choice=choice, max_tokens=16, stream=True, extra_body=SAMPLING
        )
    )
    assert finish == "length" and [c["arguments"] for c in calls.values()] == [msg.tool_calls[0].function.arguments]
    body = dict(
        model="m",
        max_tokens=16,
        messages=ASK,
        tools=ANTHROPIC_TOOLS,
        tool_choice={"type": "tool", "name": "get_weather"},
        extra_body=SAMPLING,
    )
    m = ant.messages.create(**body)
    assert m.stop_reason == "max_tokens" and [(b.type, b.name) for b in m.content] == [("tool_use", "get_weather")]
    assert isinstance(m.content[0].input, dict)
    with ant.messages.stream(**body) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "max_tokens" and [b.input for b in final.content] == [m.content[0].input]
