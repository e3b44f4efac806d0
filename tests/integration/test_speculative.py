"""Speculative decoding on a real worker (`vllmmlxd serve builtin:tiny --speculative prompt-lookup`,
drafting every step): greedy answers equal the same worker's answers with speculation turned off
per request, stop strings, tools and structured output hold under it, and /v1/status, /metrics
and the daemon's load figures count what was drafted and accepted."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.support.servers import start_serve

# Raw prompts make the random model repeat a token and then turn (drafts land, then one fails).
PROMPTS = ["Once upon a time there was", "1, 2, 3, 4, 5, 6", "The quick brown fox"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    health = tmp_path_factory.mktemp("spec") / "health.sock"
    s = start_serve(
        "builtin:tiny",
        "--speculative",
        "prompt-lookup",
        "--no-adaptive-speculation",
        "--enable-metrics",
        "--health-socket",
        str(health),
    )
    s.health = health
    yield s
    assert s.stop() == 0, s.log()[-3000:]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=60)


def complete(client, prompt: str, **kw) -> str:
    r = client.completions.create(model="m", prompt=prompt, max_tokens=40, temperature=0, **kw)
    return r.choices[0].text


def test_answers_are_the_same_with_speculation_off_per_request_and_drafts_are_counted(client, server):
    before = httpx.get(server.url + "/v1/status").json()["speculative"]
    drafted = [complete(client, p) for p in PROMPTS]
    plain = [complete(client, p, extra_body={"speculative": False}) for p in PROMPTS]
    assert drafted == plain and len(set(drafted)) == len(PROMPTS)
    after = httpx.get(server.url + "/v1/status").json()["speculative"]
    assert after["method"] == "prompt-lookup" and after["drafted_tokens"] > before["drafted_tokens"]
    assert 0 < after["accepted_tokens"] <= after["drafted_tokens"]
    metrics = httpx.get(server.url + "/metrics").text
    assert (
        f'vllmmlxd_speculative_accepted_tokens_total{{model="builtin:tiny"}} {float(after["accepted_tokens"])}'
        in metrics
    )
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(server.health))) as daemon:  # vllmmlxctl status reads this
        assert daemon.get("http://worker/health").json()["load"]["speculative"]["drafted_tokens"] > 0


def test_a_stop_string_ends_the_answer_where_it_starts(client):
    whole = complete(client, PROMPTS[0])
    stop = whole[len(whole) // 2 :][:4]
    cut = client.completions.create(model="m", prompt=PROMPTS[0], max_tokens=40, temperature=0, stop=[stop])
    assert cut.choices[0].finish_reason == "stop" and whole.startswith(cut.choices[0].text)
    assert stop not in cut.choices[0].text


def test_structured_output_and_a_forced_tool_call_hold_under_speculation(client):
    schema = {
        "type": "object",
        "properties": {"word": {"type": "string", "maxLength": 10}, "n": {"type": "integer", "maximum": 50}},
        "required": ["word", "n"],
        "additionalProperties": False,
    }
    ask = [{"role": "user", "content": 'Answer {"word": "was", "n": 3} or {"word": "fox", "n": 4}.'}]
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema, "strict": True}}
    r = client.chat.completions.create(model="m", messages=ask, max_tokens=60, temperature=0, response_format=fmt)
    assert set(json.loads(r.choices[0].message.content)) == {"word", "n"}
    tool = {"type": "function", "function": {"name": "pick", "parameters": schema}}
    r = client.chat.completions.create(
        model="m",
        messages=ask,
        max_tokens=60,
        temperature=0,
        tools=[tool],
        tool_choice={"type": "function", "function": {"name": "pick"}},
    )
    [call] = r.choices[0].message.tool_calls
    assert call.function.name == "pick" and set(json.loads(call.function.arguments)) == {"word", "n"}


def test_a_seeded_sampled_answer_is_the_same_with_and_without_speculation(client):
    kw = dict(model="m", prompt=PROMPTS[1], max_tokens=30, temperature=0.9, seed=7)
    drafted = client.completions.create(**kw).choices[0].text
    plain = client.completions.create(**kw, extra_body={"speculative": False}).choices[0].text
    assert drafted == plain


def test_speculative_must_be_a_boolean(server):
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2, "speculative": "sometimes"})
    assert r.status_code == 400 and "speculative" in r.text
