"""Named keys, scopes and limits on a real worker, seen through the official SDKs.

The worker starts open (`vllmmlxd serve builtin:tiny --health-socket`) and is given a config
with an `api_keys` section the way the daemon gives it one: parsed from YAML, pushed live
over its private socket.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from tests.support.servers import free_port, start_serve
from vllmmlxd.config.keys import key_digest
from vllmmlxd.config.load import parse_config
from vllmmlxd.config.schema import ResolvedModel
from vllmmlxd.supervisor.live import push_settings

MODEL = "builtin:tiny"
ALICE, CI, BOB, TOK = "alice-k3y-0001", "ci-k3y-0002", "bob-k3y-0003", "tok-k3y-0004"
SMALL = {"prompt": "x", "max_tokens": 2}
MSGS = [{"role": "user", "content": "hi"}]


def entry(port: int, models_section: str, api_keys: str) -> ResolvedModel:
    text = f"""
api_keys:
  alice: {{key: {ALICE}, models: ["*"]}}
  ci: {{key_sha256: {key_digest(CI)}, models: [other]}}
  bob: {{key: {BOB}, rate_limit: "2/minute"}}
  tok: {{key: {TOK}, tokens_per_minute: 12}}
models:
  m:
    model: {MODEL}
    served_model_name: {MODEL}
    port: {port}
{models_section}
  other: {{model: {MODEL}, port: {port + 1}, api_keys: {api_keys}}}
"""
    entry = parse_config(text).config.models["m"]
    assert isinstance(entry, ResolvedModel)  # served here, not an upstream
    return entry


@pytest.fixture(scope="module")
def worker():
    sock = Path(tempfile.mkdtemp(prefix="vllmmlxd-keys-")) / "w.sock"
    port = free_port()
    s = start_serve(MODEL, "--health-socket", str(sock), port=port, threads=None)
    yield s, sock, port
    assert s.stop() == 0, s.log()[-3000:]
    log = s.log()
    assert not any(k in log for k in (ALICE, CI, BOB, TOK))


def apply(sock: Path, config: ResolvedModel) -> None:
    ok, detail = asyncio.run(push_settings(sock, config))
    assert ok and detail == config.config_hash(), detail


@pytest.fixture
def keyed(worker):
    """The worker with keys alice, bob and tok allowed; ci known but scoped to another model."""
    s, sock, port = worker
    apply(sock, entry(port, "    api_keys: [alice, bob, tok]\n    rate_limit: 100", "[ci]"))
    return s


def oai(server, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=60)


def ant(server, key: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key=key, max_retries=0, timeout=60)


def test_the_sdks_raise_401_for_a_wrong_key_and_403_for_a_key_scoped_elsewhere(keyed):
    with pytest.raises(openai.AuthenticationError):
        oai(keyed, "not-a-key").models.list()
    with pytest.raises(openai.PermissionDeniedError) as info:
        oai(keyed, CI).chat.completions.create(model="m", messages=MSGS, max_tokens=2)
    assert "'ci' may not use this model" in info.value.message and info.value.body["type"] == "permission_error"
    with pytest.raises(anthropic.AuthenticationError):
        ant(keyed, "not-a-key").messages.create(model="m", messages=MSGS, max_tokens=2)
    with pytest.raises(anthropic.PermissionDeniedError) as info:
        ant(keyed, CI).messages.create(model="m", messages=MSGS, max_tokens=2)
    assert info.value.body["error"]["type"] == "permission_error"  # Anthropic's own shape
    # Both headers carry a key; the allowed ones get in through either SDK.
    assert oai(keyed, ALICE).chat.completions.create(model="m", messages=MSGS, max_tokens=2).choices
    assert ant(keyed, ALICE).messages.create(model="m", messages=MSGS, max_tokens=2).content is not None


def test_a_keys_request_limit_is_a_429_with_retry_after_and_ratelimit_headers(keyed):
    url = keyed.url + "/v1/completions"
    first = httpx.post(url, json=SMALL, headers={"Authorization": f"Bearer {BOB}"})
    assert first.status_code == 200
    # bob's own 2/minute is tighter than the model's 100/minute, so it speaks for the requests.
    assert (first.headers["x-ratelimit-limit-requests"], first.headers["x-ratelimit-remaining-requests"]) == ("2", "1")
    assert first.headers["x-ratelimit-reset-requests"].endswith("s")
    assert httpx.post(url, json=SMALL, headers={"x-api-key": BOB}).status_code == 200
    with pytest.raises(openai.RateLimitError) as info:
        oai(keyed, BOB).completions.create(model="m", prompt="x", max_tokens=2)
    headers = info.value.response.headers
    assert 1 <= int(headers["retry-after"]) <= 60 and headers["x-ratelimit-remaining-requests"] == "0"
    assert "key 'bob'" in info.value.message
    with pytest.raises(anthropic.RateLimitError):
        ant(keyed, BOB).messages.create(model="m", messages=MSGS, max_tokens=2)
    # Other keys keep their own budgets.
    assert httpx.post(url, json=SMALL, headers={"x-api-key": ALICE}).status_code == 200


def test_generated_tokens_are_charged_to_a_keys_token_budget_streamed_or_not(keyed):
    auth = {"x-api-key": TOK}
    body = {"prompt": "x", "max_tokens": 8, "ignore_eos": True}
    first = httpx.post(keyed.url + "/v1/completions", json=body, headers=auth, timeout=60)
    assert first.status_code == 200 and first.json()["usage"]["completion_tokens"] == 8
    assert first.headers["x-ratelimit-limit-tokens"] == "12"
    with httpx.stream(
        "POST", keyed.url + "/v1/completions", json={**body, "stream": True}, headers=auth, timeout=60
    ) as r:
        assert r.status_code == 200 and "[DONE]" in "".join(r.iter_text())
    # 16 generated of 12 allowed: the budget is spent until the window moves.
    r = httpx.post(keyed.url + "/v1/completions", json=body, headers=auth)
    assert r.status_code == 429 and r.headers["x-ratelimit-remaining-tokens"] == "0"
    assert "12 generated tokens per minute" in r.json()["error"]["message"]


def test_an_open_model_counts_clients_by_address_and_ignores_a_forged_forwarded_for(worker):
    s, sock, port = worker
    apply(sock, ResolvedModel(model=MODEL, served_model_name=MODEL, port=port, rate_limit=2))
    codes = [
        httpx.post(s.url + "/v1/completions", json=SMALL, headers={"X-Forwarded-For": f"9.9.9.{i}"}).status_code
        for i in range(3)
    ]
    assert codes == [200, 200, 429]  # a new X-Forwarded-For is not a new client
    # Behind a trusted proxy (here: the loopback peer) the header names the client.
    apply(
        sock,
        ResolvedModel(model=MODEL, served_model_name=MODEL, port=port, rate_limit=1, trusted_proxies=["127.0.0.1"]),
    )
    codes = [
        httpx.post(s.url + "/v1/completions", json=SMALL, headers={"X-Forwarded-For": f"9.9.8.{i}"}).status_code
        for i in range(3)
    ]
    assert codes == [200, 200, 200]
    assert httpx.post(s.url + "/v1/completions", json=SMALL, headers={"X-Forwarded-For": "9.9.8.0"}).status_code == 429


def test_health_and_metrics_are_open_unless_the_entry_puts_them_behind_the_key(worker):
    s, sock, port = worker
    apply(sock, entry(port, "    api_keys: [alice]\n    enable_metrics: true", "[ci]"))
    assert httpx.get(s.url + "/health").status_code == 200
    assert httpx.get(s.url + "/metrics").status_code == 200
    apply(
        sock,
        entry(
            port,
            "    api_keys: [alice]\n    enable_metrics: true\n    health_requires_key: true\n"
            "    metrics_requires_key: true",
            "[ci]",
        ),
    )
    assert httpx.get(s.url + "/health").status_code == 401
    assert httpx.get(s.url + "/metrics").status_code == 401
    assert httpx.get(s.url + "/metrics", headers={"x-api-key": CI}).status_code == 403
    assert httpx.get(s.url + "/health", headers={"x-api-key": ALICE}).json()["status"] == "ok"
    assert httpx.get(s.url + "/metrics", headers={"Authorization": f"Bearer {ALICE}"}).status_code == 200


def test_a_stored_response_is_its_keys_alone(worker):
    s, sock, port = worker
    eve = "eve-k3y-0005"
    text = f"""
api_keys:
  alice: {{key: {ALICE}}}
  eve: {{key: {eve}}}
models:
  m: {{model: {MODEL}, served_model_name: {MODEL}, port: {port}, api_keys: [alice, eve]}}
"""
    apply(sock, parse_config(text).config.models["m"])
    made = oai(s, ALICE).responses.create(model="m", input="hi", max_output_tokens=2)
    assert oai(s, ALICE).responses.retrieve(made.id).id == made.id
    other = oai(s, eve)
    for read in (
        lambda: other.responses.retrieve(made.id),
        lambda: other.responses.input_items.list(made.id),
        lambda: other.responses.delete(made.id),
        lambda: other.responses.create(model="m", input="more", previous_response_id=made.id, max_output_tokens=2),
    ):
        with pytest.raises(openai.NotFoundError) as info:  # as for an id that never was: nothing leaks
            read()
        assert made.id in info.value.message and info.value.body["type"] == "invalid_request_error"
    # Eve's attempts changed nothing: alice still reads and deletes it.
    assert oai(s, ALICE).responses.input_items.list(made.id).data
    oai(s, ALICE).responses.delete(made.id)
    with pytest.raises(openai.NotFoundError):
        oai(s, ALICE).responses.retrieve(made.id)
    # The entry's bound, changed live: one response kept, the newest.
    apply(
        sock,
        parse_config(
            text.replace("api_keys: [alice, eve]", "api_keys: [alice, eve], stored_responses: 1")
        ).config.models["m"],
    )
    first, second = (oai(s, ALICE).responses.create(model="m", input="hi", max_output_tokens=2) for _ in range(2))
    assert oai(s, ALICE).responses.retrieve(second.id).id == second.id
    with pytest.raises(openai.NotFoundError):
        oai(s, ALICE).responses.retrieve(first.id)
