"""The gateway in front of two real workers (`vllmmlxd serve builtin:tiny`), started by hand
with its spec on stdin, called with the official SDKs and httpx. No fakes. (Lazy models, whose
loads the daemon makes: tests/e2e/test_daemon_gateway.py.)"""

from __future__ import annotations

import concurrent.futures as cf
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from vllmmlxd.config.keys import key_digest
from tests.support.servers import free_port, start_serve

ALICE, BOB = "sk-alice-gw", "sk-bob-gw"


def grants():
    return [{"name": "alice", "sha256": key_digest(ALICE), "allowed": True},
            {"name": "bob", "sha256": key_digest(BOB), "allowed": False}]


@pytest.fixture(scope="module")
def workers():
    with cf.ThreadPoolExecutor(2) as pool:
        started = list(pool.map(lambda name: start_serve("builtin:tiny", "--served-model-name", name,
                                                         "--timeout", "60"), ("tiny-a", "tiny-b")))
    yield started
    for w in started:
        w.stop()


def base_spec(workers, port: int) -> dict:
    a, b = workers
    return {
        "gateway": {"host": "127.0.0.1", "port": port},
        "routes": [
            {"name": "alpha", "served_model_name": "tiny-a", "aliases": ["a1"], "url": a.url, "state": "ready"},
            {"name": "beta", "served_model_name": "tiny-b", "url": b.url, "state": "ready",
             "api_keys": ["alice"], "key_grants": grants()},
            {"name": "remote", "served_model_name": "remote-a", "kind": "upstream", "url": a.url, "state": "ready",
             "upstream_api_key": "sk-upstream"},
            {"name": "dead", "served_model_name": "dead-up", "kind": "upstream", "state": "ready",
             "url": f"http://127.0.0.1:{free_port()}", "timeout": 5},
        ],
        "version": 1,
    }


class Gateway:
    def __init__(self, spec: dict, port: int):
        self.port = port
        self.dir = Path(tempfile.mkdtemp(prefix="vllmmlxd-gw-"))
        self.socket = self.dir / "gw.sock"
        self.log_path = self.dir / "gateway.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "vllmmlxd.gateway", "--host", "127.0.0.1", "--port", str(port),
             "--health-socket", str(self.socket), "--state-dir", str(self.dir / "state"), "--drain-timeout", "5"],
            stdin=subprocess.PIPE, stdout=self.log_path.open("wb"), stderr=subprocess.STDOUT,
        )
        self.proc.stdin.write(json.dumps(spec).encode() + b"\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log()
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200 and self.socket.exists():
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(self.log())

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def private(self) -> httpx.Client:
        return httpx.Client(transport=httpx.HTTPTransport(uds=str(self.socket)), base_url="http://gateway")

    def wait(self, timeout: float = 15) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise


@pytest.fixture(scope="module")
def gateway(workers):
    port = free_port()
    gw = Gateway(base_spec(workers, port), port)
    yield gw
    if gw.proc.poll() is None:
        gw.proc.send_signal(signal.SIGTERM)
        assert gw.wait() == 0, gw.log()[-3000:]


def oai(gw, key="none"):
    return openai.OpenAI(base_url=gw.url + "/v1", api_key=key, max_retries=0, timeout=60)


def chat(client, model, **kw):
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                          max_tokens=kw.pop("max_tokens", 6), **kw)


def test_openai_sdk_by_served_name_entry_key_and_alias(gateway):
    client = oai(gateway)
    for name in ("tiny-a", "alpha", "a1"):
        r = chat(client, name)
        assert r.id.startswith("chatcmpl-") and r.model == "tiny-a" and r.usage.completion_tokens > 0
    comp = client.completions.create(model="alpha", prompt="Once", max_tokens=4)
    assert comp.choices[0].text is not None and comp.usage.completion_tokens > 0


def test_openai_streaming_through_the_gateway(gateway):
    chunks = list(chat(oai(gateway), "a1", stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].usage.completion_tokens > 0
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_anthropic_sdk_through_the_gateway(gateway):
    client = anthropic.Anthropic(base_url=gateway.url, api_key="none", max_retries=0, timeout=60)
    msg = client.messages.create(model="a1", max_tokens=6, messages=[{"role": "user", "content": "hi"}])
    assert msg.type == "message" and msg.model == "tiny-a" and msg.usage.output_tokens > 0
    with client.messages.stream(model="alpha", max_tokens=6, messages=[{"role": "user", "content": "hi"}]) as s:
        final = s.get_final_message()
    assert final.usage.output_tokens > 0
    counted = client.messages.count_tokens(model="tiny-a", messages=[{"role": "user", "content": "hi"}])
    assert counted.input_tokens > 0


def test_streamed_chunks_arrive_as_they_are_made(gateway):
    body = {"model": "tiny-a", "messages": [{"role": "user", "content": "go"}], "max_tokens": 24,
            "stream": True, "ignore_eos": True}
    arrivals = []
    with httpx.stream("POST", gateway.url + "/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["x-request-id"].startswith("chatcmpl-")
        for chunk in r.iter_raw():
            arrivals.append((time.monotonic(), chunk))
    data = b"".join(c for _, c in arrivals)
    assert data.rstrip().endswith(b"data: [DONE]")
    assert len(arrivals) >= 10, len(arrivals)  # one piece per token, not one buffered blob
    assert arrivals[-1][0] - arrivals[0][0] > 0.01


def test_a_query_string_cannot_change_where_a_request_goes(gateway):
    # The routed endpoints take nothing from the query: it is passed on as it came, to the same path.
    r = httpx.post(gateway.url + "/v1/completions?_path=/v1/status&_embeddings=true&path=/health",
                   json={"model": "tiny-a", "prompt": "x", "max_tokens": 2}, timeout=60)
    assert r.status_code == 200 and r.json()["object"] == "text_completion"


def test_unknown_model_is_404_in_each_family_with_the_names(gateway):
    r = httpx.post(gateway.url + "/v1/chat/completions", json={"model": "gpt-9", "messages": []})
    assert r.status_code == 404
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" or err["code"] == "model_not_found"
    assert err["code"] == "model_not_found" and "tiny-a" in err["message"] and "tiny-b" in err["message"]
    r = httpx.post(gateway.url + "/v1/messages", json={"model": "claude-9", "max_tokens": 3, "messages": []})
    assert r.status_code == 404
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "not_found_error" and "tiny-a" in body["error"]["message"]
    r = httpx.post(gateway.url + "/v1/chat/completions", json={"messages": []})
    assert r.status_code == 400 and "tiny-a" in r.json()["error"]["message"]
    r = httpx.post(gateway.url + "/v1/chat/completions", content=b"{nope", headers={"content-type": "application/json"})
    assert r.status_code == 400


def test_keys_are_checked_before_proxying(gateway):
    with pytest.raises(openai.AuthenticationError):
        chat(oai(gateway), "tiny-b")
    with pytest.raises(openai.PermissionDeniedError):
        chat(oai(gateway, BOB), "beta")
    assert chat(oai(gateway, ALICE), "beta").model == "tiny-b"
    bad = anthropic.Anthropic(base_url=gateway.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        bad.messages.create(model="tiny-b", max_tokens=3, messages=[{"role": "user", "content": "hi"}])
    shown = lambda key: {m.id for m in oai(gateway, key).models.list().data}  # noqa: E731
    assert shown("none") == {"tiny-a", "remote-a", "dead-up"}
    assert shown(ALICE) == {"tiny-a", "tiny-b", "remote-a", "dead-up"}
    card = next(m for m in oai(gateway).models.list().data if m.id == "tiny-a")
    assert (card.entry, card.aliases, card.state, card.kind) == ("alpha", ["a1"], "ready", "local")


def test_client_disconnect_cancels_the_generation(gateway, workers):
    worker = workers[0]
    body = {"model": "a1", "messages": [{"role": "user", "content": "go"}], "max_tokens": 4000,
            "stream": True, "ignore_eos": True}
    with httpx.stream("POST", gateway.url + "/v1/chat/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        for _ in range(3):
            next(lines)
        assert httpx.get(worker.url + "/v1/status").json()["num_running"] == 1
    deadline = time.monotonic() + 3
    while httpx.get(worker.url + "/v1/status").json()["num_running"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert httpx.get(worker.url + "/v1/status").json()["num_running"] == 0


def sse_data(gateway, path, body, key=None):
    headers = {"authorization": f"Bearer {key}"} if key else None
    with httpx.stream("POST", gateway.url + path, json=body, headers=headers, timeout=60) as r:
        assert r.status_code == 200, r.read()
        return [line[6:] for line in r.iter_lines() if line.startswith("data: ")]


def test_api_chat_streams_openai_sse(gateway):
    data = sse_data(gateway, "/api/chat", {"model": "alpha", "system": "Be brief.", "max_tokens": 5,
                                           "temperature": 0.5, "top_p": 0.9,
                                           "messages": [{"role": "user", "content": "hi"}]})
    assert data[-1] == "[DONE]"
    events = [json.loads(d) for d in data[:-1]]
    assert events[0]["object"] == "chat.completion.chunk" and events[0]["model"] == "tiny-a"
    assert events[-1]["usage"]["completion_tokens"] > 0  # include_usage was asked for
    assert sse_data(gateway, "/api/chat", {"model": "beta", "max_tokens": 3, "messages": [
        {"role": "user", "content": "hi"}]}, key=ALICE)[-1] == "[DONE]"


def test_api_complete_streams_unless_told_not_to(gateway):
    data = sse_data(gateway, "/api/complete", {"model": "a1", "prompt": "Once", "max_tokens": 4})
    assert data[-1] == "[DONE]" and json.loads(data[-2])["usage"]["completion_tokens"] > 0
    r = httpx.post(gateway.url + "/api/complete", json={"model": "a1", "prompt": "Once", "max_tokens": 4,
                                                        "stream": False}, timeout=60)
    assert r.status_code == 200 and r.json()["object"] == "text_completion"


def test_api_models_and_health(gateway):
    data = httpx.get(gateway.url + "/api/models").json()["data"]
    assert [m["id"] for m in data] == ["alpha", "remote", "dead"]
    assert data[0] == {"id": "alpha", "name": "tiny-a", "aliases": ["a1"], "state": "ready", "kind": "local",
                       "load": "eager", "owned_by": "vllmmlxd", "embedding_model": None}
    keyed = httpx.get(gateway.url + "/api/models", headers={"authorization": f"Bearer {ALICE}"}).json()["data"]
    assert [m["id"] for m in keyed] == ["alpha", "beta", "remote", "dead"]
    health = httpx.get(gateway.url + "/api/health").json()
    assert health["status"] == "ok" and health["models"]["beta"] == {"state": "ready", "model": "tiny-b", "ok": True}
    assert httpx.get(gateway.url + "/health").json() == {"status": "ok", "models": 4}


def test_upstream_with_its_own_key(gateway):
    # The worker is open: it answers whatever key the gateway substitutes; the name is rewritten to the served one.
    assert chat(oai(gateway), "remote").model == "tiny-a"


def test_dead_upstream_is_503_quickly_while_others_answer(gateway):
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as err:
        chat(oai(gateway), "dead-up")
    assert err.value.status_code == 503 and time.monotonic() - started < 3
    assert "cannot be reached" in err.value.message
    r = httpx.post(gateway.url + "/v1/messages", json={"model": "dead", "max_tokens": 3, "messages": [
        {"role": "user", "content": "hi"}]})
    assert r.status_code == 529 and r.json()["error"]["type"] == "overloaded_error"
    assert chat(oai(gateway), "alpha").model == "tiny-a"


def test_private_health_and_live_push(gateway, workers):
    with gateway.private() as private:
        health = private.get("/health").json()
        assert health["status"] == "ok" and health["load"]["requests"] == 0 and len(health["config_hash"]) == 16
        spec = base_spec(workers, gateway.port)
        spec["routes"].append({"name": "gamma", "served_model_name": "tiny-c", "url": workers[1].url, "state": "ready"})
        spec["routes"].append({"name": "gone", "served_model_name": "gone-up", "kind": "upstream",
                               "url": "http://127.0.0.1:9", "state": "unreachable", "last_error": "no route to host"})
        spec["version"] = 2
        r = private.post("/internal/settings", json=spec)
        assert r.status_code == 200 and r.json()["ok"] is True
        assert r.json()["config_hash"] == private.get("/health").json()["config_hash"] != health["config_hash"]
        moved = {**spec, "gateway": {"host": "127.0.0.1", "port": gateway.port + 1}}
        assert private.post("/internal/settings", json=moved).status_code == 409
        bad = {**spec, "routes": [{"name": "x", "url": "http://h", "api_key": "sha256:" + "ab" * 32}]}
        refused = private.post("/internal/settings", json=bad)
        assert refused.status_code == 422 and refused.json()["ok"] is False
        assert "served_model_name" in refused.json()["error"] and "abab" not in refused.text
    assert chat(oai(gateway), "tiny-c").model == "tiny-b"
    r = httpx.post(gateway.url + "/v1/chat/completions", json={"model": "gone-up", "messages": []})
    assert r.status_code == 503 and r.headers["retry-after"] == "5" and "no route to host" in r.json()["error"]["message"]
    assert httpx.get(gateway.url + "/api/health").json()["status"] == "degraded"


def test_ui_page_and_static_files(gateway):
    page = httpx.get(gateway.url + "/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.headers["cache-control"] == "no-cache"
    assert httpx.get(gateway.url + "/static/").status_code == 404  # no listing
    assert httpx.get(gateway.url + "/static/..%2F..%2Fconfig%2Fgateway.py").status_code == 404


def bare_gateway() -> Gateway:
    port = free_port()
    return Gateway({"gateway": {"port": port}, "routes": []}, port)


def test_exits_0_on_sigterm_and_on_stdin_eof():
    by_signal, by_eof = bare_gateway(), bare_gateway()
    by_signal.proc.send_signal(signal.SIGTERM)
    by_eof.proc.stdin.close()
    assert by_signal.wait() == 0, by_signal.log()
    assert by_eof.wait() == 0, by_eof.log()
    assert "gateway.orphaned" in by_eof.log() and not by_eof.socket.exists()
