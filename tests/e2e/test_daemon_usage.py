"""Usage per key and budgets on the real daemon: what `vllmmlxctl usage` counts equals the sum of
the responses' `usage` over a mixed run (OpenAI chat streamed and not, Responses, Anthropic,
Ollama; through the gateway and on the workers' ports), survives `vllmmlxctl restart` and a
daemon restart; a key's daily token budget answers 429 on every route once spent, in each
family's error shape, and a reload that raises it lets the key through without a restart."""

from __future__ import annotations

import json
import time

import anthropic
import httpx
import openai
import pytest

from tests.support.daemon import free_port, make_daemon, model_entry

ALICE, BOB, CAROL = "alice-usage-k3y", "bob-usage-k3y", "carol-usage-k3y"


@pytest.fixture(scope="module")
def daemon():
    d = make_daemon()
    d.ports = {"a": free_port(), "b": free_port()}
    d.gateway_port = free_port()
    d.keys = {
        "alice": {"key": ALICE},
        "bob": {"key": BOB},
        "carol": {"key": CAROL, "budget": {"tokens_per_day": 60}},
    }
    d.models_config = {
        "a": model_entry(d.ports["a"], api_keys=["alice", "bob", "carol"]),
        "b": model_entry(d.ports["b"], api_keys=["alice", "carol"]),
    }
    d.write(d.models_config, api_keys=d.keys, gateway={"port": d.gateway_port})
    d.start()
    d.wait_for(
        lambda ms: (
            all(m["state"] == "ready" for m in ms.values())
            and len(ms) == 2
            and (d.status().get("gateway") or {}).get("state") == "ready"
        ),
        what="models and gateway ready",
    )
    yield d
    d.stop()


def usage(d) -> tuple[dict[tuple[str, str], dict], dict]:
    """`vllmmlxctl usage --json`, by (key, model), once every worker has written its counts."""
    time.sleep(2.5)  # a worker writes its counts once a second
    out = d.ctl("usage", "--since", "1h", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    return {(r["key"], r["model"]): r for r in report["rows"]}, report


def test_usage_equals_the_responses_usage_and_survives_restarts(daemon):
    d = daemon
    gateway = f"http://127.0.0.1:{d.gateway_port}"
    sent: dict[tuple[str, str], list[int]] = {}  # (key, model): [requests, prompt, completion]

    def note(key: str, model: str, prompt: int, completion: int) -> None:
        row = sent.setdefault((key, model), [0, 0, 0])
        row[0], row[1], row[2] = row[0] + 1, row[1] + prompt, row[2] + completion

    via_gateway = openai.OpenAI(base_url=gateway + "/v1", api_key=ALICE, max_retries=0)
    direct_a = openai.OpenAI(base_url=f"http://127.0.0.1:{d.ports['a']}/v1", api_key=BOB, max_retries=0)
    hello = [{"role": "user", "content": "Hello there"}]
    r = via_gateway.chat.completions.create(model="b", messages=hello, max_tokens=6, temperature=0)
    note("alice", "b", r.usage.prompt_tokens, r.usage.completion_tokens)
    stream = via_gateway.chat.completions.create(
        model="a", messages=hello, max_tokens=5, stream=True, stream_options={"include_usage": True}
    )
    last = [c for c in stream][-1]
    note("alice", "a", last.usage.prompt_tokens, last.usage.completion_tokens)
    resp = direct_a.responses.create(model="a", input="Say something", max_output_tokens=7)
    note("bob", "a", resp.usage.input_tokens, resp.usage.output_tokens)
    claude = anthropic.Anthropic(base_url=gateway, api_key=ALICE, max_retries=0)
    msg = claude.messages.create(model="a", max_tokens=4, messages=[{"role": "user", "content": "Hi"}])
    note("alice", "a", msg.usage.input_tokens, msg.usage.output_tokens)
    answer = httpx.post(
        f"http://127.0.0.1:{d.ports['b']}/ollama/api/chat",
        json={"model": "b", "messages": hello, "stream": False, "options": {"num_predict": 3}},
        headers={"Authorization": f"Bearer {ALICE}"},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    ollama = answer.json()
    note("alice", "b", ollama["prompt_eval_count"], ollama["eval_count"])
    bad = httpx.post(  # a client mistake: a request and an error, no tokens
        f"http://127.0.0.1:{d.ports['a']}/v1/chat/completions",
        json={"model": "a", "messages": "not a list"},
        headers={"Authorization": f"Bearer {BOB}"},
        timeout=60,
    )
    assert bad.status_code == 400
    httpx.get(f"http://127.0.0.1:{d.ports['a']}/v1/models", headers={"Authorization": f"Bearer {BOB}"})  # a read

    def expected_rows(rows: dict) -> None:
        for (key, model), (requests, prompt, completion) in sent.items():
            row = rows[(key, model)]
            extra = 1 if (key, model) == ("bob", "a") else 0  # the refused request
            assert (row["requests"], row["errors"]) == (requests + extra, extra), row
            assert (row["input_tokens"], row["output_tokens"]) == (prompt, completion), row
        assert set(rows) == set(sent)

    rows, _ = usage(d)
    expected_rows(rows)
    assert d.ctl("restart", "a").returncode == 0
    d.wait_ready(["a", "b"])
    expected_rows(usage(d)[0])
    d.stop()
    d.start()
    d.wait_ready(["a", "b"])
    expected_rows(usage(d)[0])
    shown = d.ctl("usage").stdout
    assert "alice" in shown and "IN (CACHED)" in shown and ALICE not in shown
    # The gateway's /api/status shows a key its own use only.
    for key, name in ((ALICE, "alice"), (BOB, "bob")):
        status = httpx.get(gateway + "/api/status", headers={"Authorization": f"Bearer {key}"}, timeout=30).json()
        assert {r["key"] for r in status["usage"]["rows"]} == {name}


def test_a_daily_token_budget_answers_429_on_every_route_until_a_reload_raises_it(daemon):
    d = daemon
    a = f"http://127.0.0.1:{d.ports['a']}"
    gateway = f"http://127.0.0.1:{d.gateway_port}"
    auth = {"Authorization": f"Bearer {CAROL}"}
    chat = {"model": "a", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8}
    for _ in range(30):  # spend the 60 tokens
        r = httpx.post(a + "/v1/chat/completions", json=chat, headers=auth, timeout=60)
        if r.status_code == 429:
            break
        assert r.status_code == 200, r.text
        time.sleep(1.2)  # the next request sees what this one used, whichever worker it meets
    else:
        raise AssertionError("the budget never ran out")
    error = r.json()["error"]
    assert error["code"] == "budget_exceeded" and "60 tokens per day" in error["message"]
    assert "resets at" in error["message"] and int(r.headers["retry-after"]) > 0
    routes = [
        (a + "/v1/completions", {"model": "a", "prompt": "x", "max_tokens": 2}, "openai"),
        (a + "/v1/responses", {"model": "a", "input": "x", "max_output_tokens": 2}, "responses"),
        (
            a + "/v1/messages",
            {"model": "a", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]},
            "anthropic",
        ),
        (
            a + "/ollama/api/chat",
            {"model": "a", "messages": [{"role": "user", "content": "x"}], "stream": False},
            "ollama",
        ),
        (gateway + "/v1/chat/completions", {**chat, "model": "b"}, "openai"),  # another worker, through the gateway
    ]
    for url, body, family in routes:
        refused = httpx.post(url, json=body, headers=auth, timeout=60)
        assert refused.status_code == 429, (url, refused.text)
        shape = refused.json()
        if family == "anthropic":
            assert shape["type"] == "error" and shape["error"]["type"] == "rate_limit_error"
        elif family == "ollama":
            assert "60 tokens per day" in shape["error"]
        else:
            assert "60 tokens per day" in shape["error"]["message"]
    _, report = usage(d)
    [carol] = [b for b in report["budgets"] if b["key"] == "carol"]
    assert carol["tokens_per_day"] == 60 and carol["left"]["tokens_per_day"] == 0
    pids = sorted(d.worker_pids())
    keys = {**d.keys, "carol": {"key": CAROL, "budget": {"tokens_per_day": 1_000_000}}}
    d.write(d.models_config, api_keys=keys, gateway={"port": d.gateway_port})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        r = httpx.post(a + "/v1/chat/completions", json=chat, headers=auth, timeout=60)
        if r.status_code == 200:
            break
        time.sleep(0.5)
    assert r.status_code == 200, r.text
    assert sorted(d.worker_pids()) == pids  # applied live: no worker restarted
