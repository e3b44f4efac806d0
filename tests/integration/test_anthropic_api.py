"""The Anthropic Messages API of a real worker, called with the official anthropic SDK and httpx:
what a coding agent sends, in the order and shapes it expects."""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest

from tests.support.servers import start_serve

KEY = "sk-ant-local-test-key"


@pytest.fixture(scope="module")
def server():
    s = start_serve("builtin:tiny", "--api-key", KEY, "--timeout", "60", "--log-level", "debug")
    yield s
    assert s.stop() == 0, s.log()[-3000:]


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0, timeout=60)


HI = [{"role": "user", "content": "Say hello."}]


def test_create_answers_with_a_message(client):
    m = client.messages.create(model="claude-sonnet-4-5", max_tokens=8, messages=HI, extra_body={"temperature": 0})
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_")
    assert m.content[0].type == "text" and m.content[0].text
    assert m.stop_reason == "max_tokens" and m.stop_sequence is None
    assert m.usage.output_tokens == 8 and m.usage.input_tokens > 0


def test_stream_gives_the_same_message_in_the_documented_order(client, server):
    body = {"model": "any", "max_tokens": 10, "messages": HI}
    whole = client.messages.create(**body, extra_body={"temperature": 0})
    with client.messages.stream(**body, extra_body={"temperature": 0}) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole.content[0].text == final.content[0].text
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens
    # The raw frames: every event named, in Anthropic's order.
    with httpx.stream(
        "POST",
        server.url + "/v1/messages",
        json={**body, "temperature": 0, "stream": True},
        headers={"x-api-key": KEY},
        timeout=60,
    ) as r:
        assert r.status_code == 200
        names, types = [], []
        for line in r.iter_lines():
            if line.startswith("event: "):
                names.append(line[7:])
            elif line.startswith("data: "):
                types.append(json.loads(line[6:])["type"])
    assert names == types
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    body_events = [n for n in names if n != "ping"]
    assert body_events[1] == "content_block_start" and body_events[-3] == "content_block_stop"
    assert set(body_events[2:-3]) == {"content_block_delta"}


def test_stop_sequence_is_reported_with_the_string_that_matched(client):
    text = client.messages.create(model="x", max_tokens=12, messages=HI, extra_body={"temperature": 0}).content[0].text
    stop = text[3:6]
    m = client.messages.create(
        model="x", max_tokens=12, messages=HI, stop_sequences=[stop, "zzzz"], extra_body={"temperature": 0}
    )
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop
    assert m.content[0].text == text[: text.index(stop)]


def test_count_tokens_equals_the_input_tokens_of_the_same_request(client):
    system = "You are a careful assistant."
    tools = [
        {
            "name": "get_weather",
            "description": "Weather for a city",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        }
    ]
    counted = client.messages.count_tokens(model="x", system=system, messages=HI, tools=tools).input_tokens
    used = client.messages.create(model="x", max_tokens=1, system=system, messages=HI, tools=tools).usage.input_tokens
    assert counted == used and counted > 20


def test_keys_are_taken_as_x_api_key_or_bearer_and_errors_have_anthropics_shape(server):
    url = server.url + "/v1/messages"
    body = {"model": "x", "max_tokens": 2, "messages": HI}
    assert httpx.post(url, json=body, headers={"x-api-key": KEY}).status_code == 200
    assert httpx.post(url, json=body, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    r = httpx.post(url, json=body, headers={"x-api-key": "wrong"})
    assert r.status_code == 401 and r.json() == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "missing or invalid API key"},
    }
    bad = anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        bad.messages.create(model="x", max_tokens=2, messages=HI)
    r = httpx.post(url, json={"model": "x", "messages": HI}, headers={"x-api-key": KEY})  # no max_tokens
    assert r.status_code == 400 and r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in r.json()["error"]["message"]


def test_an_image_on_a_text_only_model_is_a_clear_400(client):
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(
            model="x",
            max_tokens=2,
            messages=[{"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}],
        )
    assert "image" in info.value.message and info.value.status_code == 400


def test_every_response_carries_its_request_id(server):
    r = httpx.post(server.url + "/v1/messages", json={"max_tokens": 2, "messages": HI}, headers={"x-api-key": KEY})
    assert r.headers["x-request-id"] == r.json()["id"]
    mine = "client-chosen-id-42"
    r = httpx.post(
        server.url + "/v1/messages",
        json={"max_tokens": 2, "messages": HI},
        headers={"x-api-key": KEY, "x-request-id": mine},
    )
    assert r.headers["x-request-id"] == mine == r.json()["id"]
    assert f"request_id={mine}" in server.log()  # the engine's log line names the same id
    r = httpx.post(server.url + "/v1/messages", json={"messages": HI}, headers={"x-api-key": "nope"})
    assert r.status_code == 401 and r.headers["x-request-id"].startswith("req_")


def post(server, path, body):
    return httpx.post(server.url + path, json=body, headers={"x-api-key": KEY}, timeout=60)


def test_schemas_that_cannot_be_held_are_named_400s_never_500s(server):
    ask = {"max_tokens": 200, "messages": HI, "seed": 1}
    r = post(server, "/v1/messages", {**ask, "output_format": {"type": "json_schema", "schema": {"$ref": "#"}}})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert "no output can satisfy" in r.json()["error"]["message"]
    endless = {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}  # fails mid-decode
    r = post(server, "/v1/messages", {**ask, "output_format": {"type": "json_schema", "schema": endless}})
    assert r.status_code == 400 and "grammar" in r.json()["error"]["message"], r.text


def test_a_client_chat_template_is_refused_on_messages_and_count_tokens(server):
    for path, extra in (("/v1/messages", {"max_tokens": 2}), ("/v1/messages/count_tokens", {})):
        r = post(server, path, {"messages": HI, "chat_template": "{{ 'pwned' }}", **extra})
        assert r.status_code == 400 and "chat_template" in r.json()["error"]["message"], r.text


def served_line(server, request_id: str, timeout: float = 10.0) -> dict:
    """The worker's access-log line for ``request_id`` (written as the response's last byte goes out)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        for line in server.log().splitlines():
            if "event=request.served" in line and f"request_id={request_id} " in line:
                return dict(field.split("=", 1) for field in line.split() if "=" in field)
        assert time.monotonic() < deadline, f"no access-log line for {request_id}"
        time.sleep(0.05)


def test_each_request_gets_one_access_log_line_without_content_or_keys(server):
    secret = "Zanzibar-prompt-7781"
    whole = post(server, "/v1/messages", {"max_tokens": 3, "messages": [{"role": "user", "content": secret}]})
    line = served_line(server, whole.json()["id"])
    assert line["level"] == "info" and line["method"] == "POST" and line["route"] == "/v1/messages"
    assert line["status"] == "200" and line["model"] and int(line["prompt_tokens"]) > 0
    assert line["completion_tokens"] == "3" and int(line["cached_tokens"]) >= 0
    assert float(line["ttft_s"]) <= float(line["duration_s"])
    chat = {"messages": [{"role": "user", "content": secret}], "max_tokens": 2, "stream": True}
    with httpx.stream(
        "POST", server.url + "/v1/chat/completions", json=chat, headers={"x-api-key": KEY}, timeout=60
    ) as r:
        rid = r.headers["x-request-id"]
        r.read()
    line = served_line(server, rid)
    assert line["route"] == "/v1/chat/completions" and line["status"] == "200" and line["completion_tokens"] == "2"
    refused = httpx.post(
        server.url + "/v1/messages",
        json={"max_tokens": 2, "messages": HI},
        headers={"x-api-key": "sk-wrong-key-55", "x-request-id": "trace-refused"},
        timeout=60,
    )
    assert served_line(server, "trace-refused")["status"] == str(refused.status_code) == "401"
    log = server.log()
    assert secret not in log and KEY not in log and "sk-wrong-key-55" not in log
    assert sum(1 for ln in log.splitlines() if "event=request.served" in ln and f"request_id={rid} " in ln) == 1
