"""OpenAI's Responses API on a real worker (`vllmmlxd serve builtin:tiny`), with the official
openai SDK: ``responses.create`` and ``responses.stream`` (the same text, the SDK's own event
accumulation), a forced function call and its output sent back, ``text.format`` enforced, and
what is not supported refused as a 400 naming it. Random weights: only what holds by
construction is asserted (shapes, enforcement, equality of two paths, seeded sampling)."""

from __future__ import annotations

import base64
import json
import socket
import time

import httpx
import openai
import pytest

from tests.support import spec_watch
from tests.support.pdf import text_pdf
from tests.support.servers import start_serve

TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


@pytest.fixture(scope="module")
def server():
    s = start_serve("builtin:tiny", "--timeout", "60")
    yield s
    assert s.stop() == 0, s.log()[-3000:]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="not-needed", max_retries=0, timeout=60)


def test_create_and_stream_give_the_same_text_and_the_sdks_types(client):
    kw = dict(model="tiny", input="Tell me a story", instructions="Be brief.", max_output_tokens=12, temperature=0)
    made = client.responses.create(**kw)
    assert made.id.startswith("resp_") and made.object == "response"
    assert made.status in ("completed", "incomplete")
    assert [item.type for item in made.output] == ["message"]
    assert made.output_text == made.output[0].content[0].text
    assert made.usage.output_tokens <= 12 and made.usage.input_tokens > 0
    if made.status == "incomplete":
        assert made.incomplete_details.reason == "max_output_tokens"
    with client.responses.stream(**kw) as stream:
        events = list(stream)
    kinds = [event.type for event in events]
    # Cut by max_output_tokens (random weights rarely stop): OpenAI ends such a stream with
    # response.incomplete, whose response is the whole object (the SDK's get_final_response
    # waits for response.completed, which the schema test below gets).
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == ("response.completed" if made.status == "completed" else "response.incomplete")
    assert events[-1].response.output_text == made.output_text
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == made.output_text and "response.output_item.done" in kinds


def test_the_events_are_numbered_in_order_and_each_is_checked_against_the_spec(server):
    body = {"input": "Hi", "max_output_tokens": 4, "temperature": 0, "stream": True, "ignore_eos": True}
    before = spec_watch.CHECKED[0]
    with httpx.stream("POST", server.url + "/v1/responses", json=body, timeout=60) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert spec_watch.CHECKED[0] - before == len(events)  # the suite's spec watch read every one (conftest)
    # Cut by the limit: the message item says so too, and the response carries the values applied.
    last = events[-1]["response"]
    assert last["status"] == "incomplete" and last["output"][-1]["status"] == "incomplete"
    assert (last["temperature"], last["top_p"], last["completed_at"] >= last["created_at"]) == (0, 1.0, True)


def test_a_forced_function_call_and_its_output_round_trip(client):
    made = client.responses.create(
        model="tiny",
        input="What is the weather in Paris?",
        tools=[TOOL],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=40,
        temperature=0,
    )
    calls = [item for item in made.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].call_id.startswith("call_")
    assert set(json.loads(calls[0].arguments)) == {"city"}
    # The call and its output sent back: the next turn is a plain answer.
    follow = client.responses.create(
        model="tiny",
        input=[
            {"role": "user", "content": "What is the weather in Paris?"},
            {
                "type": "function_call",
                "call_id": calls[0].call_id,
                "name": "get_weather",
                "arguments": calls[0].arguments,
            },
            {"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny, 21 C"},
        ],
        tools=[TOOL],
        tool_choice="none",
        max_output_tokens=8,
        temperature=0,
    )
    assert [item.type for item in follow.output] == ["message"]


def test_text_format_json_schema_is_enforced(client):
    schema = {
        "type": "object",
        "properties": {"colour": {"type": "string", "maxLength": 10}},
        "required": ["colour"],
        "additionalProperties": False,
    }
    kw = dict(
        model="tiny",
        input="Name a colour.",
        text={"format": {"type": "json_schema", "name": "colour", "schema": schema, "strict": True}},
        max_output_tokens=40,
        temperature=0.7,
        extra_body={"seed": 3},
    )
    made = client.responses.create(**kw)
    assert made.status == "completed" and set(json.loads(made.output_text)) == {"colour"}
    # The JSON closes before max_output_tokens: the stream completes, and the SDK's helper reads it.
    with client.responses.stream(**kw) as stream:
        final = stream.get_final_response()
    assert final.output_text == made.output_text


@pytest.mark.parametrize(
    "extra, param, words",
    [
        ({"tools": [{"type": "custom", "name": "patch"}]}, "tools[0].type", "custom (free-form) tools"),
        ({"tools": [{"type": "web_search"}], "tool_choice": {"type": "web_search"}}, "tool_choice", "web_search"),
        ({"include": ["file_search_call.results"]}, "include", "not supported"),
        ({"text": {"format": {"type": "xml"}}}, "text.format.type", "not supported"),
        ({"max_output_tokens": 0}, "max_output_tokens", ""),
    ],
)
def test_what_is_not_supported_is_a_400_naming_it(client, extra, param, words):
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="tiny", input="Hi", **extra)
    body = err.value.body
    assert err.value.status_code == 400 and body["param"] == param and words in body["message"]


def test_hosted_tools_are_left_out_and_named_in_a_header(server):
    # As Codex sends by default: the answer is the one without them (greedy), and the header says what was left.
    plain = {"model": "tiny", "input": "Hi", "max_output_tokens": 6, "temperature": 0, "tools": [TOOL]}
    hosted = {
        **plain,
        "tools": [{"type": "web_search"}, TOOL, {"type": "code_interpreter", "container": {"type": "auto"}}],
    }
    alone = httpx.post(server.url + "/v1/responses", json=plain, timeout=60)
    r = httpx.post(server.url + "/v1/responses", json=hosted, timeout=60)
    assert r.status_code == 200 and r.headers["x-vllmmlxd-ignored-tools"] == "web_search,code_interpreter"
    assert "x-vllmmlxd-ignored-tools" not in alone.headers
    assert said(r.json()) == said(alone.json())
    assert [t["type"] for t in r.json()["tools"]] == ["web_search", "function", "code_interpreter"]  # as asked
    with httpx.stream("POST", server.url + "/v1/responses", json={**hosted, "stream": True}, timeout=60) as s:
        assert s.headers["x-vllmmlxd-ignored-tools"] == "web_search,code_interpreter"
        done = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: ")][-1]
    assert said(done["response"]) == said(alone.json())


def said(body: dict) -> list[tuple]:
    """What a response's output items say, without their ids."""
    return [
        (i["type"], [c.get("text") for c in i.get("content", [])], i.get("name"), i.get("arguments"))
        for i in body["output"]
    ]


def test_an_input_file_pdf_is_read_as_its_text(server, client):
    pdf = base64.b64encode(text_pdf("The fixture title", "Second page")).decode()
    ask = {"type": "input_text", "text": "Its title?"}
    as_file = {"type": "input_file", "filename": "fixture.pdf", "file_data": f"data:application/pdf;base64,{pdf}"}
    as_text = {
        "type": "input_text",
        "text": "\n[file: fixture.pdf]\nThe fixture title\n\nSecond page\n[end of file]\n",
    }
    kw = dict(model="tiny", max_output_tokens=6, temperature=0)
    filed = client.responses.create(input=[{"role": "user", "content": [ask, as_file]}], **kw)
    typed = client.responses.create(input=[{"role": "user", "content": [ask, as_text]}], **kw)
    assert filed.usage.input_tokens == typed.usage.input_tokens and filed.output_text == typed.output_text
    chat = {"type": "file", "file": {"filename": "fixture.pdf", "file_data": f"data:application/pdf;base64,{pdf}"}}
    r = httpx.post(
        server.url + "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": [{"type": "text", "text": "Its title?"}, chat]}], **kw},
        timeout=60,
    )
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] > typed.usage.input_tokens - 10, r.text
    empty = {**as_file, "file_data": "data:application/pdf;base64," + base64.b64encode(text_pdf()).decode()}
    bad = httpx.post(server.url + "/v1/responses", json={"input": [{"role": "user", "content": [empty]}]}, timeout=30)
    assert bad.status_code == 400 and "no text to read" in bad.json()["error"]["message"]
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200


def test_bad_input_items_are_400s_in_openais_shape(server):
    for item, param in (
        ({"type": "telepathy"}, "input[0].type"),
        ({"type": "function_call_output", "output": "x"}, "input[0].call_id"),
        ({"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}, "input[0].content[0]"),
    ):
        r = httpx.post(server.url + "/v1/responses", json={"input": [item]}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_previous_response_id_carries_the_conversation_and_the_prefix_cache_serves_it(client):
    first = client.responses.create(model="tiny", input="My name is Ada.", max_output_tokens=6, temperature=0)
    second = client.responses.create(
        model="tiny", input="What is my name?", previous_response_id=first.id, max_output_tokens=6, temperature=0
    )
    third = client.responses.create(
        model="tiny", input="And again?", previous_response_id=second.id, max_output_tokens=6, temperature=0
    )
    assert third.previous_response_id == second.id
    # Each turn's prompt holds the earlier ones: it grows, and the earlier turns come from the cache.
    assert first.usage.input_tokens < second.usage.input_tokens < third.usage.input_tokens
    assert second.usage.input_tokens_details.cached_tokens > 0
    assert third.usage.input_tokens_details.cached_tokens >= second.usage.input_tokens - 1  # the last is fed
    # The same conversation sent whole gives the same answer (greedy: equality of two paths).
    whole = client.responses.create(
        model="tiny",
        input=[
            {"role": "user", "content": "My name is Ada."},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "What is my name?"},
        ],
        max_output_tokens=6,
        temperature=0,
    )
    assert whole.output_text == second.output_text


def test_a_stored_response_is_retrieved_listed_and_deleted(client):
    made = client.responses.create(model="tiny", input="Hello there", max_output_tokens=4, temperature=0)
    again = client.responses.retrieve(made.id)
    assert again.id == made.id and again.output_text == made.output_text
    items = client.responses.input_items.list(made.id, order="asc").data
    assert [i.type for i in items] == ["message"] and items[0].content[0].text == "Hello there"
    deleted = client.responses.delete(made.id)
    assert deleted is None or getattr(deleted, "deleted", True)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(made.id)
    with pytest.raises(openai.NotFoundError) as err:
        client.responses.create(model="tiny", input="x", previous_response_id=made.id)
    assert err.value.body["param"] == "previous_response_id"


def test_store_false_keeps_nothing(client):
    made = client.responses.create(model="tiny", input="Hi", max_output_tokens=2, store=False)
    assert made.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(made.id)


def generated(server) -> int:
    """Tokens the worker has generated so far, once nothing is running or waiting."""
    deadline = time.monotonic() + 60
    while (status := httpx.get(server.url + "/v1/status").json())["num_running"] or status["num_waiting"]:
        assert time.monotonic() < deadline, status
        time.sleep(0.05)
    return status["total_completion_tokens"]


def test_a_client_that_disconnects_cancels_the_generation_streamed_and_not(server):
    # 1,900 tokens that cannot end early (ignore_eos, an extension as on chat completions): had the
    # disconnect not cancelled them, the worker would have generated them all.
    body = {"input": "Count", "max_output_tokens": 1900, "ignore_eos": True}
    before = generated(server)
    with httpx.stream("POST", server.url + "/v1/responses", json={**body, "stream": True}, timeout=60) as r:
        lines = r.iter_lines()
        assert next(line for line in lines if "response.output_text.delta" in line)
    streamed = generated(server) - before
    assert 0 < streamed < 1900 // 2, streamed
    # Not streamed: the client hangs up once the worker is generating its answer.
    payload = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", server.port)) as conn:
        conn.sendall(
            f"POST /v1/responses HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nContent-Type: application/json\r\n".encode()
            + f"Content-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        deadline = time.monotonic() + 30
        while not httpx.get(server.url + "/v1/status").json()["num_running"]:
            assert time.monotonic() < deadline
            time.sleep(0.02)
    assert 0 < generated(server) - before - streamed < 1900 // 2


def test_truncation_auto_drops_the_oldest_turns_and_disabled_refuses(client):
    long = "word " * 700  # ~700 tokens a turn: three of them overflow builtin:tiny's 2,048
    conversation = []
    for n in range(3):
        conversation += [{"role": "user", "content": f"{n} {long}"}, {"role": "assistant", "content": "ok"}]
    conversation.append({"role": "user", "content": "The last question"})
    kw = dict(model="tiny", input=conversation, instructions="Be brief.", max_output_tokens=2, temperature=0)
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(**kw)
    assert err.value.body["code"] == "context_length_exceeded"
    cut = client.responses.create(truncation="auto", **kw)
    alone = client.responses.create(**{**kw, "input": conversation[-1:]})
    # The oldest turn went, no more: the two after it and the last question still fit.
    assert alone.usage.input_tokens + 1000 < cut.usage.input_tokens < 2048
    assert cut.truncation == "auto"
