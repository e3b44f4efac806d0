"""`vllmmlxd serve` flags that bound requests: --timeout, --max-queue, --stream-interval, --api-key."""

from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest

from tests.support.servers import start_serve

KEY = "s3cret-key-for-tests"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def server():
    s = start_serve(
        "builtin:tiny",
        "--timeout",
        "2",
        "--max-num-seqs",
        "1",
        "--max-queue",
        "1",
        "--stream-interval",
        "4",
        "--api-key",
        KEY,
    )
    yield s
    assert s.stop() == 0
    assert KEY not in s.log()


def long_body(stream: bool) -> dict:
    return {"prompt": "x", "max_tokens": 1900, "ignore_eos": True, "stream": stream}


def test_api_key_is_required_except_for_health(server):
    url = server.url + "/v1/completions"
    body = {"prompt": "x", "max_tokens": 2}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"x-api-key": "wrong"}):
        r = httpx.post(url, json=body, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        assert KEY not in r.text
    assert httpx.post(url, json=body, headers=AUTH).status_code == 200
    assert httpx.post(url, json=body, headers={"x-api-key": KEY}).status_code == 200
    assert httpx.get(server.url + "/v1/models").status_code == 401
    assert httpx.get(server.url + "/health").status_code == 200
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
    assert client.models.list().data[0].id == "builtin:tiny"


def test_timeout_is_504_when_not_streaming(server):
    started = time.monotonic()
    r = httpx.post(server.url + "/v1/completions", json=long_body(False), headers=AUTH, timeout=30)
    assert r.status_code == 504 and r.json()["error"]["type"] == "timeout_error"
    assert time.monotonic() - started < 6


def test_timeout_is_an_error_event_then_done_when_streaming(server):
    with httpx.stream("POST", server.url + "/v1/completions", json=long_body(True), headers=AUTH, timeout=30) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    assert json.loads(lines[-2][6:])["error"]["code"] == "timeout"


def test_stream_interval_groups_tokens(server):
    body = {"prompt": "x", "max_tokens": 20, "ignore_eos": True, "temperature": 0}
    whole = httpx.post(server.url + "/v1/completions", json=body, headers=AUTH).json()["choices"][0]["text"]
    with httpx.stream("POST", server.url + "/v1/completions", json={**body, "stream": True}, headers=AUTH) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    texts = [e["choices"][0]["text"] for e in events if e["choices"][0]["text"]]
    assert "".join(texts) == whole
    assert 2 <= len(texts) <= 6  # 20 tokens in chunks of 4 (+ the detokenizer's last flush)


def test_full_queue_is_503_and_a_waiting_request_is_not_refused(server):
    """One request runs (max-num-seqs 1), one waits (max-queue 1): the third is turned away with 503."""
    with httpx.stream(
        "POST", server.url + "/v1/completions", json=long_body(True), headers=AUTH, timeout=30
    ) as running:
        lines = running.iter_lines()  # kept: dropping the iterator would close the stream
        next(lines)
        waiting_result: dict = {}

        def waiting() -> None:
            r = httpx.post(
                server.url + "/v1/completions", json={"prompt": "y", "max_tokens": 3}, headers=AUTH, timeout=30
            )
            waiting_result["status"] = r.status_code

        t = threading.Thread(target=waiting)
        t.start()
        deadline = time.monotonic() + 5
        while httpx.get(server.url + "/v1/status", headers=AUTH).json()["num_waiting"] < 1:
            assert time.monotonic() < deadline, "second request never queued"
            time.sleep(0.02)
        r = httpx.post(server.url + "/v1/completions", json={"prompt": "z", "max_tokens": 3}, headers=AUTH)
        assert r.status_code == 503 and r.json()["error"]["type"] == "overloaded_error"
        assert 1 <= int(r.headers["Retry-After"]) <= 60
        active = httpx.get(server.url + "/v1/status", headers=AUTH).json()["requests"]
        assert [a["phase"] for a in active] == ["generation", "queued"]
        assert active[0]["generated_tokens"] > 0 and active[0]["ttft_s"] is not None and active[0]["max_tokens"] == 1900
    t.join(30)
    assert waiting_result["status"] == 200


def test_model_defaults_apply_when_the_request_is_silent():
    s = start_serve("builtin:tiny", "--default-temperature", "0", "--max-tokens", "7", "--max-request-tokens", "50")
    try:
        body = {"prompt": "Once upon a time", "ignore_eos": True}
        a = httpx.post(s.url + "/v1/completions", json=body).json()
        b = httpx.post(s.url + "/v1/completions", json=body).json()
        assert a["usage"]["completion_tokens"] == 7 and a["choices"][0]["finish_reason"] == "length"
        assert a["choices"][0]["text"] == b["choices"][0]["text"]  # temperature 0 by default: greedy
        # Above max_request_tokens: served, clamped to it, and the finish reason says so.
        r = httpx.post(s.url + "/v1/completions", json={**body, "max_tokens": 51}).json()
        assert r["usage"]["completion_tokens"] == 50 and r["choices"][0]["finish_reason"] == "length"
    finally:
        assert s.stop() == 0
