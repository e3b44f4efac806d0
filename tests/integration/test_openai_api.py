"""The OpenAI-compatible API of a real worker (`vllmmlxd serve builtin:tiny`), called
with the official openai SDK and httpx. No fakes: the real MLX engine generates."""

from __future__ import annotations

import concurrent.futures as cf
import json
import time

import httpx
import openai
import pytest

from tests.support.servers import start_serve, version_fields

NAME = "tiny-test"


@pytest.fixture(scope="module")
def server():
    s = start_serve("builtin:tiny", "--served-model-name", NAME, "--owned-by", "maclustr", "--timeout", "60")
    yield s
    assert s.stop() == 0, s.log()[-3000:]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="not-needed", max_retries=0, timeout=60)


def chat(client, content="Tell me a story", **kw):
    kw.setdefault("max_tokens", 24)
    extra = {k: kw.pop(k) for k in ("ignore_eos", "top_k", "repetition_penalty") if k in kw}
    if extra:
        kw["extra_body"] = {**kw.get("extra_body", {}), **extra}
    kw.setdefault("model", "default")
    return client.chat.completions.create(messages=[{"role": "user", "content": content}], **kw)


def stream_text(stream, kind="chat"):
    chunks = list(stream)
    if kind == "chat":
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        text = "".join(c.choices[0].text for c in chunks if c.choices)
    return text, chunks


def sse_lines(server, path, body, headers=None):
    with httpx.stream("POST", server.url + path, json=body, headers=headers, timeout=60) as r:
        assert r.status_code == 200, r.read()
        return [line for line in r.iter_lines() if line]


def test_health_names_the_model(server):
    assert httpx.get(server.url + "/health").json() == {"status": "ok", "model": NAME, **version_fields()}


def test_models_lists_the_served_name_and_owner(client):
    models = client.models.list().data
    assert [(m.id, m.owned_by) for m in models] == [(NAME, "maclustr")]


def test_chat_non_streaming(client):
    r = chat(client, temperature=0)
    assert r.id.startswith("chatcmpl-") and r.model == NAME
    assert r.choices[0].message.role == "assistant"
    assert isinstance(r.choices[0].message.content, str) and r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 5 and 0 < r.usage.completion_tokens <= 24
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_streaming_shape(server):
    lines = sse_lines(
        server,
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 12,
            "stream": True,
            "temperature": 0,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
        },
    )
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(line[6:]) for line in lines[:-1]]
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert len({e["id"] for e in events}) == 1 and events[0]["id"].startswith("chatcmpl-")
    assert len({e["created"] for e in events}) == 1
    assert all(e["object"] == "chat.completion.chunk" for e in events)
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 12
    assert all(e["choices"][0]["finish_reason"] is None for e in events[:-2])


def test_greedy_streamed_text_equals_non_streamed_chat(client):
    whole = chat(client, temperature=0, max_tokens=40).choices[0].message.content
    streamed, chunks = stream_text(chat(client, temperature=0, max_tokens=40, stream=True))
    assert streamed == whole
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_greedy_streamed_text_equals_non_streamed_completion(client):
    kw = dict(model="default", prompt="The capital of France is", max_tokens=40, temperature=0)
    whole = client.completions.create(**kw)
    streamed, chunks = stream_text(client.completions.create(stream=True, **kw), "completion")
    assert whole.object == "text_completion" and whole.choices[0].text
    assert streamed == whole.choices[0].text
    assert {c.id for c in chunks} == {chunks[0].id}


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_cuts_the_output(client, stream):
    full = chat(client, temperature=0, max_tokens=40, ignore_eos=True).choices[0].message.content
    assert len(full) > 12
    stop = full[8:12]
    cut = full[: full.index(stop)]
    if stream:
        text, chunks = stream_text(
            chat(client, temperature=0, max_tokens=40, ignore_eos=True, stop=[stop], stream=True)
        )
        reason = chunks[-1].choices[0].finish_reason
    else:
        r = chat(client, temperature=0, max_tokens=40, ignore_eos=True, stop=stop)
        text, reason = r.choices[0].message.content, r.choices[0].finish_reason
    assert text == cut and stop not in text
    assert reason == "stop"


def test_same_seed_same_text_at_temperature_one(client):
    a = chat(client, temperature=1.0, seed=1234, max_tokens=30).choices[0].message.content
    b = chat(client, temperature=1.0, seed=1234, max_tokens=30).choices[0].message.content
    c = chat(client, temperature=1.0, seed=99, max_tokens=30).choices[0].message.content
    assert a == b
    assert a != c


def test_top_k_one_is_greedy(client):
    greedy = chat(client, temperature=0, max_tokens=20, ignore_eos=True).choices[0].message.content
    top1 = (
        chat(client, temperature=1.0, max_tokens=20, ignore_eos=True, extra_body={"top_k": 1})
        .choices[0]
        .message.content
    )
    assert top1 == greedy


def test_logit_bias_forces_a_token(server, client):
    token = httpx.post(server.url + "/v1/completions", json={"prompt": [1], "max_tokens": 1}).json()  # warm path
    assert token["usage"]["prompt_tokens"] == 1
    r = chat(client, temperature=0, max_tokens=5, ignore_eos=True, logit_bias={"28": 100})
    assert r.choices[0].message.content == "," * 5  # token 28 of SmolLM2's vocabulary is ","


def test_penalties_change_greedy_output(client):
    base = chat(client, temperature=0, max_tokens=40, ignore_eos=True).choices[0].message.content
    penal = chat(client, temperature=0, max_tokens=40, ignore_eos=True, frequency_penalty=2.0, presence_penalty=2.0)
    rep = chat(client, temperature=0, max_tokens=40, ignore_eos=True, extra_body={"repetition_penalty": 5.0})
    assert penal.choices[0].message.content != base
    assert rep.choices[0].message.content != base


def test_ignore_eos_and_max_tokens_give_exact_length(client):
    r = client.completions.create(
        model="default", prompt="a", max_tokens=17, temperature=0.5, extra_body={"ignore_eos": True}
    )
    assert r.usage.completion_tokens == 17 and r.choices[0].finish_reason == "length"


@pytest.mark.parametrize("model", [None, "default", NAME, "builtin:tiny"])
def test_model_field_is_optional_and_default_matches(server, model):
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    if model:
        body["model"] = model
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200 and r.json()["model"] == NAME


def assert_openai_error(r: httpx.Response, status: int, param=None):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param:
        assert err["param"] == param


def test_client_mistakes_get_4xx_in_openai_shape(server):
    url = server.url + "/v1/chat/completions"
    msgs = [{"role": "user", "content": "hi"}]
    assert_openai_error(httpx.post(url, content=b"{not json", headers={"content-type": "application/json"}), 422)
    assert_openai_error(httpx.post(url, json=[1, 2]), 422)
    assert_openai_error(httpx.post(url, json={}), 422, "messages")
    assert_openai_error(httpx.post(url, json={"messages": msgs, "max_tokens": "lots"}), 400, "max_tokens")
    assert_openai_error(httpx.post(url, json={"messages": msgs, "max_tokens": -5}), 400, "max_tokens")
    assert_openai_error(httpx.post(url, json={"messages": "hi"}), 400, "messages")
    assert_openai_error(httpx.post(url, json={"messages": msgs, "temperature": -1}), 400, "temperature")
    assert_openai_error(httpx.post(server.url + "/v1/nope", json={}), 404)
    assert_openai_error(httpx.get(server.url + "/v1/chat/completions"), 405)
    long_prompt = "hello " * 3000  # tiny's context is 2048 tokens
    r = httpx.post(url, json={"messages": [{"role": "user", "content": long_prompt}]}, timeout=60)
    assert_openai_error(r, 400)
    assert r.json()["error"]["code"] == "context_length_exceeded"
    r = httpx.post(server.url + "/v1/completions", json={"prompt": long_prompt, "stream": True}, timeout=60)
    assert_openai_error(r, 400)
    big = b'{"prompt": "' + b"a" * (17 * 1024 * 1024) + b'"}'
    assert_openai_error(httpx.post(server.url + "/v1/completions", content=big, timeout=60), 413)
    # ...and the worker is still alive and serving.
    assert httpx.get(server.url + "/health").status_code == 200
    assert httpx.post(url, json={"messages": msgs, "max_tokens": 2}, timeout=60).status_code == 200


def test_two_concurrent_requests_both_succeed(client):
    with cf.ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(chat, client, f"story {i}", max_tokens=30, ignore_eos=True) for i in range(4)]
        results = [f.result() for f in futures]
    assert all(r.usage.completion_tokens == 30 for r in results)


def first_token_latency(server) -> float:
    started = time.perf_counter()
    with httpx.stream(
        "POST", server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 5, "stream": True}, timeout=60
    ) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                return time.perf_counter() - started
    raise AssertionError("no token")


def abandoned_tokens(server, abandon) -> int:
    """How many tokens a 1,900-token request made before the engine let it go, once ``abandon`` left it."""
    status = lambda: httpx.get(server.url + "/v1/status").json()  # noqa: E731
    before = status()["total_completion_tokens"]
    abandon({"prompt": "x", "max_tokens": 1900, "ignore_eos": True})
    deadline = time.monotonic() + 120
    while ((now := status())["num_running"] or now["num_waiting"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert now["num_running"] == 0 and now["num_waiting"] == 0
    return now["total_completion_tokens"] - before


def test_client_disconnect_mid_stream_frees_the_engine(server):
    def read_one_event_and_leave(body: dict) -> None:
        with httpx.stream("POST", server.url + "/v1/completions", json={**body, "stream": True}, timeout=60) as r:
            assert next(r.iter_lines()).startswith("data: ")

    # Counted, not timed: a request nobody reads any more ends long before its 1,900 tokens.
    assert abandoned_tokens(server, read_one_event_and_leave) < 1900 // 2
    assert first_token_latency(server) > 0  # and the engine serves the next one


def test_client_disconnect_while_not_streaming_frees_the_engine(server):
    def time_out(body: dict) -> None:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(server.url + "/v1/completions", json=body, timeout=0.3)

    assert abandoned_tokens(server, time_out) < 1900 // 2


def test_status_reports_counters(server):
    s = httpx.get(server.url + "/v1/status").json()
    assert s["status"] == "running" and s["model"] == NAME
    assert s["total_requests_processed"] > 0 and s["total_completion_tokens"] > 0
    assert {"active_memory_gb", "peak_memory_gb", "cache_memory_gb"} <= set(s["metal"])


def test_any_model_name_is_answered_by_this_model(client):
    r = chat(client, model="gpt-4o")  # agents send their own names: one model per port
    assert r.model == NAME and r.choices[0].message.content is not None


def test_a_strict_model_name_refuses_other_names():
    s = start_serve("builtin:tiny", "--strict-model-name", "--served-model-name", "tiny-strict")
    try:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        r = httpx.post(s.url + "/v1/chat/completions", json={**body, "model": "gpt-4o"})
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
        assert httpx.post(s.url + "/v1/chat/completions", json={**body, "model": "tiny-strict"}).status_code == 200
        r = httpx.post(
            s.url + "/v1/messages",
            json={"model": "claude", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
        )
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    finally:
        assert s.stop() == 0


def test_max_tokens_far_above_the_limits_is_served_clamped(client):
    # ~1,900 prompt tokens: what is left of the context is short to generate.
    r = chat(client, "hi " * 1900, max_tokens=64000, extra_body={"ignore_eos": True})
    # builtin:tiny's context is 2,048 tokens: the answer runs to its end, and says so.
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens + r.usage.completion_tokens == 2048


@pytest.mark.parametrize(
    "field,value", [("best_of", 2), ("top_logprobs", 3), ("top_logprobs", 21), ("audio", {"voice": "x"}), ("n", 129)]
)
def test_a_field_this_server_would_not_honour_is_refused_naming_it(server, field, value):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, field: value}
    r = httpx.post(server.url + "/v1/chat/completions", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == field


def test_every_response_carries_the_id_of_its_body(server):
    r = httpx.post(
        server.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    )
    assert r.headers["x-request-id"] == r.json()["id"] and r.json()["id"].startswith("chatcmpl-")
    r = httpx.get(server.url + "/v1/models", headers={"x-request-id": "trace-7"})
    assert r.headers["x-request-id"] == "trace-7"
    assert httpx.get(server.url + "/nope").headers["x-request-id"].startswith("req_")


NO_FINITE_VALUE = {"$ref": "#"}  # compiles, and no JSON value can ever satisfy it
ENDLESS = {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}  # starts, then fails mid-decode


def schema_format(schema):
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def test_a_schema_no_output_can_satisfy_is_a_400_before_decoding(server):
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 20,
        "response_format": schema_format(NO_FINITE_VALUE),
    }
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert_openai_error(r, 400, "response_format.json_schema.schema")
    assert "no output can satisfy" in r.json()["error"]["message"]


def test_a_grammar_that_fails_while_decoding_is_a_named_client_error_never_a_500(server):
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 200,
        "seed": 1,
        "response_format": schema_format(ENDLESS),
    }
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert_openai_error(r, 400)
    assert r.json()["error"]["code"] == "constraint_failed" and "grammar" in r.json()["error"]["message"]
    frames = [
        json.loads(line[len("data: ") :])
        for line in sse_lines(server, "/v1/chat/completions", {**body, "stream": True})
        if line.startswith("data: {")
    ]
    assert frames[-1]["error"]["type"] == "invalid_request_error" and frames[-1]["error"]["code"] == "constraint_failed"


def test_a_client_chat_template_is_refused_naming_it(server):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "chat_template": "{{ 'pwned' }}"}
    assert_openai_error(httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60), 400, "chat_template")


def test_every_top_level_key_of_the_status_is_documented(server):
    from pathlib import Path

    docs = Path(__file__).resolve().parents[2] / "docs" / "api.md"
    section = docs.read_text().split("\n## Status\n", 1)[1].split("\n## ", 1)[0]
    table = [line for line in section.splitlines() if line.startswith("| `")]
    documented = {key for line in table for key in line.split("|")[1].replace("`", " ").replace(",", " ").split()}
    status = httpx.get(server.url + "/v1/status").json()
    assert set(status) - documented == set()
    assert {"blas", "threads", "cpus"} <= set(status["runtime"])  # the BLAS block is under runtime


def test_the_tokenizer_routes_round_trip_and_count_what_chat_sends(server, client):
    said = httpx.post(server.url + "/tokenize", json={"prompt": "Hello there", "add_special_tokens": False}).json()
    assert said["count"] == len(said["tokens"]) and said["max_model_len"] == 2048
    back = httpx.post(server.url + "/detokenize", json={"tokens": said["tokens"]}).json()
    assert back == {"prompt": "Hello there"}
    messages = [{"role": "user", "content": "Hello there"}]
    counted = httpx.post(server.url + "/tokenize", json={"messages": messages}).json()["count"]
    assert counted == client.chat.completions.create(model="tiny", messages=messages, max_tokens=1).usage.prompt_tokens
    info = httpx.get(server.url + "/tokenizer_info").json()
    assert info["eos_token"] and "{%" in info["chat_template"]
    bad = httpx.post(server.url + "/detokenize", json={"tokens": [10**9]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
    assert httpx.post(server.url + "/tokenize", json={}).status_code == 400


def test_n_choices_share_one_prefill_repeat_with_a_seed_and_stream_by_index(server, client):
    from vllmmlxd.api.choices import SEED_STRIDE

    ask = [{"role": "user", "content": "Tell me something about " + "the sea and the sky " * 12}]
    kw = dict(model="tiny", messages=ask, max_tokens=6, temperature=1.0, seed=11)
    four = client.chat.completions.create(n=4, **kw)
    assert [c.index for c in four.choices] == [0, 1, 2, 3]
    again = client.chat.completions.create(n=4, **kw)
    assert [c.message.content for c in again.choices] == [c.message.content for c in four.choices]  # the seed holds
    # Choice i is the answer of one request with choice i's seed: n is n ordinary rows.
    third = client.chat.completions.create(**{**kw, "seed": (11 + 2 * SEED_STRIDE) % 2**64})
    assert third.choices[0].message.content == four.choices[2].message.content
    # The prompt counted once, its prefill shared: the others started from the prefix cache's blocks.
    assert four.usage.prompt_tokens == third.usage.prompt_tokens
    assert four.usage.completion_tokens <= 24
    # A fresh prompt past admission's wait (64 shared tokens): the others wait for its prefill and take its blocks.
    river = [{"role": "user", "content": "A new question " + "about rivers and lakes " * 30}]
    fresh = client.chat.completions.create(n=4, **{**kw, "messages": river})
    assert fresh.usage.prompt_tokens_details.cached_tokens >= fresh.usage.prompt_tokens - 32
    chunks = list(client.chat.completions.create(n=4, stream=True, **kw))
    texts = ["", "", "", ""]
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    assert texts == [c.message.content for c in four.choices]
    cmpl = httpx.post(
        server.url + "/v1/completions", json={"prompt": "Once", "n": 2, "max_tokens": 4, "seed": 3}
    ).json()
    assert [c["index"] for c in cmpl["choices"]] == [0, 1]


def test_a_suffix_to_a_model_without_fim_tokens_is_a_400_saying_so(server):
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "def f(", "suffix": "return x", "max_tokens": 4})
    assert r.status_code == 400 and r.json()["error"]["param"] == "suffix"
    assert "no fill-in-the-middle tokens" in r.json()["error"]["message"]


def test_a_prediction_changes_nothing_in_the_answer_and_is_counted(server, client):
    kw = dict(model="tiny", messages=[{"role": "user", "content": "Once upon a time"}], max_tokens=16, temperature=0)
    plain = client.chat.completions.create(**kw, extra_body={"speculative": False})
    text = plain.choices[0].message.content
    predicted = client.chat.completions.create(**kw, prediction={"type": "content", "content": text})
    parts = client.chat.completions.create(
        **kw, prediction={"type": "content", "content": [{"type": "text", "text": text}]}
    )
    assert predicted.choices[0].message.content == parts.choices[0].message.content == text
    details = predicted.usage.completion_tokens_details
    assert details.accepted_prediction_tokens >= 0 and details.rejected_prediction_tokens >= 0
    assert plain.usage.completion_tokens_details.accepted_prediction_tokens == 0
    bad = httpx.post(server.url + "/v1/chat/completions", json={**kw, "prediction": {"type": "image"}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "prediction"
