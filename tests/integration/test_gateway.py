"""The gateway in front of two real workers (`vllmmlxd serve builtin:tiny`), started by hand
with its spec on stdin, called with the official SDKs and httpx. No fakes. (Lazy models, whose
loads the daemon makes: tests/e2e/test_daemon_gateway.py.)"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import contextlib
import http.server
import json
import signal
import socketserver
import tempfile
import threading
import time
from pathlib import Path
from typing import ClassVar

import anthropic
import httpx
import openai
import pytest

from tests.support.gateway import Gateway
from tests.support.servers import free_port, start_serve, version_fields
from vllmmlxd.config.gateway import GatewaySpec
from vllmmlxd.config.keys import key_digest
from vllmmlxd.config.load import parse_config
from vllmmlxd.supervisor.gateway import build_route
from vllmmlxd.supervisor.live import push_settings

ALICE, BOB = "sk-alice-gw", "sk-bob-gw"


def grants():
    return [
        {"name": "alice", "sha256": key_digest(ALICE), "allowed": True},
        {"name": "bob", "sha256": key_digest(BOB), "allowed": False},
    ]


@pytest.fixture(scope="module")
def workers():
    with cf.ThreadPoolExecutor(2) as pool:
        started = list(
            pool.map(
                lambda name: start_serve("builtin:tiny", "--served-model-name", name, "--timeout", "60"),
                ("tiny-a", "tiny-b"),
            )
        )
    yield started
    for w in started:
        w.stop()


def base_spec(workers, port: int) -> dict:
    a, b = workers
    return {
        "gateway": {"host": "127.0.0.1", "port": port},
        "routes": [
            {"name": "alpha", "served_model_name": "tiny-a", "aliases": ["a1"], "url": a.url, "state": "ready"},
            {
                "name": "beta",
                "served_model_name": "tiny-b",
                "url": b.url,
                "state": "ready",
                "api_keys": ["alice"],
                "key_grants": grants(),
            },
            {
                "name": "remote",
                "served_model_name": "remote-a",
                "kind": "upstream",
                "url": a.url,
                "state": "ready",
                "upstream_api_key": "sk-upstream",
            },
            {
                "name": "dead",
                "served_model_name": "dead-up",
                "kind": "upstream",
                "state": "ready",
                "url": f"http://127.0.0.1:{free_port()}",
                "timeout": 5,
            },
        ],
        "version": 1,
    }


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
    return client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=kw.pop("max_tokens", 6), **kw
    )


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


def test_responses_through_the_gateway_and_back_to_the_worker_that_stored_them(gateway):
    client = oai(gateway)
    made = client.responses.create(model="alpha", input="Hi", max_output_tokens=4, temperature=0)
    assert made.id.startswith("resp_") and made.model == "tiny-a"
    again = client.responses.retrieve(made.id)
    assert again.id == made.id and again.output_text == made.output_text
    assert [i.type for i in client.responses.input_items.list(made.id).data] == ["message"]
    # previous_response_id goes to the worker that holds it, whatever model the request names.
    with httpx.Client(base_url=gateway.url, timeout=60) as h:
        follow = h.post(
            "/v1/responses",
            json={"model": "tiny-b", "input": "More", "previous_response_id": made.id, "max_output_tokens": 2},
            headers={"authorization": f"Bearer {ALICE}"},
        )
        assert follow.status_code == 200 and follow.headers["x-vllmmlxd-backend"] == "alpha", follow.text
        assert follow.json()["previous_response_id"] == made.id
    client.responses.delete(made.id)
    for rid in (made.id, "resp_00000000_nothing", "chatcmpl-x"):
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(rid)


def test_streamed_chunks_arrive_as_they_are_made(gateway):
    body = {
        "model": "tiny-a",
        "messages": [{"role": "user", "content": "go"}],
        "max_tokens": 24,
        "stream": True,
        "ignore_eos": True,
    }
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
    r = httpx.post(
        gateway.url + "/v1/completions?_path=/v1/status&_embeddings=true&path=/health",
        json={"model": "tiny-a", "prompt": "x", "max_tokens": 2},
        timeout=60,
    )
    assert r.status_code == 200 and r.json()["object"] == "text_completion"


def test_unknown_model_is_404_in_each_family_with_the_names(gateway):
    r = httpx.post(gateway.url + "/v1/chat/completions", json={"model": "gpt-9", "messages": []})
    assert r.status_code == 404
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" or err["code"] == "model_not_found"
    # Only the names the caller may use: tiny-b needs alice's key.
    assert err["code"] == "model_not_found" and "tiny-a" in err["message"] and "tiny-b" not in err["message"]
    r = httpx.post(
        gateway.url + "/v1/chat/completions",
        json={"model": "gpt-9", "messages": []},
        headers={"authorization": f"Bearer {ALICE}"},
    )
    assert "tiny-a" in r.json()["error"]["message"] and "tiny-b" in r.json()["error"]["message"]
    r = httpx.post(gateway.url + "/v1/messages", json={"model": "claude-9", "max_tokens": 3, "messages": []})
    assert r.status_code == 404
    body = r.json()
    assert (
        body["type"] == "error" and body["error"]["type"] == "not_found_error" and "tiny-a" in body["error"]["message"]
    )
    assert "tiny-b" not in body["error"]["message"]
    r = httpx.post(gateway.url + "/v1/chat/completions", json={"messages": []})
    assert r.status_code == 400 and "tiny-a" in r.json()["error"]["message"] and "tiny-b" not in r.text
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
    body = {
        "model": "a1",
        "messages": [{"role": "user", "content": "go"}],
        "max_tokens": 4000,
        "stream": True,
        "ignore_eos": True,
    }
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
    data = sse_data(
        gateway,
        "/api/chat",
        {
            "model": "alpha",
            "system": "Be brief.",
            "max_tokens": 5,
            "temperature": 0.5,
            "top_p": 0.9,
            "messages": [{"role": "user", "content": "hi"}],
        },
    )
    assert data[-1] == "[DONE]"
    events = [json.loads(d) for d in data[:-1]]
    assert events[0]["object"] == "chat.completion.chunk" and events[0]["model"] == "tiny-a"
    assert events[-1]["usage"]["completion_tokens"] > 0  # include_usage was asked for
    assert (
        sse_data(
            gateway,
            "/api/chat",
            {"model": "beta", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]},
            key=ALICE,
        )[-1]
        == "[DONE]"
    )


def test_api_complete_streams_unless_told_not_to(gateway):
    data = sse_data(gateway, "/api/complete", {"model": "a1", "prompt": "Once", "max_tokens": 4})
    assert data[-1] == "[DONE]" and json.loads(data[-2])["usage"]["completion_tokens"] > 0
    r = httpx.post(
        gateway.url + "/api/complete",
        json={"model": "a1", "prompt": "Once", "max_tokens": 4, "stream": False},
        timeout=60,
    )
    assert r.status_code == 200 and r.json()["object"] == "text_completion"


def test_api_models_and_health(gateway):
    data = httpx.get(gateway.url + "/api/models").json()["data"]
    assert [m["id"] for m in data] == ["alpha", "remote", "dead"]
    assert data[0] == {
        "id": "alpha",
        "name": "tiny-a",
        "aliases": ["a1"],
        "state": "ready",
        "kind": "local",
        "load": "eager",
        "owned_by": "vllmmlxd",
        "embedding_model": None,
    }
    keyed = httpx.get(gateway.url + "/api/models", headers={"authorization": f"Bearer {ALICE}"}).json()["data"]
    assert [m["id"] for m in keyed] == ["alpha", "beta", "remote", "dead"]
    # Health names only the models the caller may use (the summary counts them all).
    health = httpx.get(gateway.url + "/api/health").json()
    assert health["status"] == "ok" and list(health["models"]) == ["alpha", "remote", "dead"]
    health = httpx.get(gateway.url + "/api/health", headers={"x-api-key": ALICE}).json()
    assert health["models"]["beta"] == {"state": "ready", "model": "tiny-b", "ok": True}
    assert httpx.get(gateway.url + "/health").json() == {"status": "ok", "models": 4, **version_fields()}


def test_upstream_with_its_own_key(gateway):
    # The worker is open: it answers whatever key the gateway substitutes; the name is rewritten to the served one.
    assert chat(oai(gateway), "remote").model == "tiny-a"


def test_dead_upstream_is_503_quickly_while_others_answer(gateway):
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as err:
        chat(oai(gateway), "dead-up")
    assert err.value.status_code == 503 and time.monotonic() - started < 3
    assert "cannot be reached" in err.value.message
    r = httpx.post(
        gateway.url + "/v1/messages",
        json={"model": "dead", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status_code == 529 and r.json()["error"]["type"] == "overloaded_error"
    assert chat(oai(gateway), "alpha").model == "tiny-a"


def test_private_health_and_live_push(gateway, workers):
    with gateway.private() as private:
        health = private.get("/health").json()
        assert health["status"] == "ok" and health["load"]["requests"] == 0 and len(health["config_hash"]) == 16
        spec = base_spec(workers, gateway.port)
        spec["routes"].append({"name": "gamma", "served_model_name": "tiny-c", "url": workers[1].url, "state": "ready"})
        spec["routes"].append(
            {
                "name": "gone",
                "served_model_name": "gone-up",
                "kind": "upstream",
                "url": "http://127.0.0.1:9",
                "state": "unreachable",
                "last_error": "no route to host",
            }
        )
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
    assert (
        r.status_code == 503 and r.headers["retry-after"] == "5" and "no route to host" in r.json()["error"]["message"]
    )
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


class Squatter(http.server.BaseHTTPRequestHandler):
    """Another program on a port: answers anything with 200, naming another model, and notes what it got."""

    seen: ClassVar[list[dict]] = []

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length") or 0))
        Squatter.seen.append({k.lower(): v for k, v in self.headers.items()})
        body = json.dumps(
            {
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": "someone-else",
                "choices": [
                    {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "not yours"}}
                ],
            }
        ).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST

    def log_message(self, *args):
        pass


@pytest.fixture
def squatter():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Squatter)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Squatter.seen = []
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@contextlib.contextmanager
def pushed(gateway, spec):
    """The gateway on ``spec`` (a dict, or a GatewaySpec with its secrets), then back on its first one."""
    body = spec.to_worker_json() if isinstance(spec, GatewaySpec) else json.dumps(spec)
    with gateway.private() as private:
        r = private.post("/internal/settings", content=body)
        assert r.status_code == 200, r.text
        try:
            yield
        finally:
            private.post("/internal/settings", json=gateway.spec)


def test_a_model_that_is_not_ready_is_503_and_whoever_holds_its_port_gets_nothing(gateway, workers, squatter):
    # The model could not listen (another program holds its port): the daemon shows it failed.
    spec = base_spec(workers, gateway.port)
    spec["routes"] += [
        {
            "name": "taken",
            "served_model_name": "taken",
            "url": squatter,
            "state": "failed",
            "last_error": "cannot listen on 127.0.0.1:8000: Address already in use",
        },
        {"name": "later", "served_model_name": "later", "url": squatter, "state": "backoff"},
    ]
    with pushed(gateway, spec):
        for model in ("taken", "later"):
            r = httpx.post(
                gateway.url + "/v1/chat/completions",
                json={"model": model, "messages": [{"role": "user", "content": "hi"}]},
                headers={"authorization": "Bearer sk-client"},
                timeout=30,
            )
            assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
            assert f"model {model} is not serving" in r.json()["error"]["message"]
        r = httpx.post(
            gateway.url + "/api/chat", json={"model": "taken", "messages": [{"role": "user", "content": "hi"}]}
        )
        assert r.status_code == 503
        r = httpx.post(
            gateway.url + "/v1/messages",
            json={"model": "taken", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]},
        )
        assert r.status_code == 529 and r.json()["error"]["type"] == "overloaded_error"
    assert Squatter.seen == []


def test_an_upstream_without_its_own_key_is_never_sent_the_clients(gateway, workers, squatter):
    spec = base_spec(workers, gateway.port)
    spec["routes"].append(
        {"name": "far", "served_model_name": "far", "kind": "upstream", "url": squatter, "state": "ready"}
    )
    with pushed(gateway, spec):
        r = httpx.post(
            gateway.url + "/v1/chat/completions",
            json={"model": "far", "messages": [{"role": "user", "content": "hi"}]},
            headers={"authorization": "Bearer sk-local", "x-api-key": "sk-local", "x-vllmmlxd-gateway-token": "forged"},
        )
        assert r.status_code == 200
    (seen,) = Squatter.seen
    assert not {"authorization", "x-api-key", "x-vllmmlxd-gateway-token", "x-vllmmlxd-client"} & seen.keys(), seen
    assert "sk-local" not in json.dumps(seen)


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


@contextlib.contextmanager
def control_socket(status: dict):
    """A stand-in for the daemon's control socket answering ``GET /status`` with ``status``."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps(status).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def address_string(self):
            return "daemon"

        def log_message(self, *args):
            pass

    path = Path(tempfile.mkdtemp(prefix="vllmmlxd-ctl-")) / "control.sock"
    server = _UnixHTTPServer(str(path), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield str(path)
    finally:
        server.shutdown()
        server.server_close()


def test_api_status_shows_a_key_only_its_models_and_no_process_output(gateway, workers):
    status = {
        "daemon": {
            "pid": 4100,
            "uptime_s": 5.0,
            "config_path": "/etc/vllmmlxd/config.yaml",
            "config_hash": "h",
            "version": "0.1",
        },
        "models": [
            {
                "name": "alpha",
                "state": "ready",
                "pid": 4101,
                "host": "127.0.0.1",
                "port": 1,
                "served_model_name": "tiny-a",
                "keys": None,
                "mcp": [
                    {
                        "name": "files",
                        "transport": "stdio",
                        "state": "failed",
                        "tools": 0,
                        "last_error": "closed (stderr: TOKEN=sk-mcp-env)",
                        "stderr": ["TOKEN=sk-mcp-env"],
                    }
                ],
            },
            {
                "name": "beta",
                "state": "ready",
                "pid": 4102,
                "host": "127.0.0.1",
                "port": 2,
                "served_model_name": "tiny-b",
                "keys": ["alice", "carol"],
            },
        ],
    }
    with control_socket(status) as path, pushed(gateway, {**base_spec(workers, gateway.port), "control_socket": path}):
        assert httpx.get(gateway.url + "/api/status").status_code == 401  # beta is keyed: some key is needed
        shown = httpx.get(gateway.url + "/api/status", headers={"authorization": f"Bearer {ALICE}"}).json()
        assert [m["name"] for m in shown["models"]] == ["alpha", "beta"]
        assert shown["models"][1]["keys"] == ["alice"] and shown["daemon"] == {"uptime_s": 5.0, "version": "0.1"}
        for hidden in ("pid", "config_path", "sk-mcp-env", "stderr", "last_error", "carol"):
            assert hidden not in json.dumps(shown), hidden
        # A key allowed only elsewhere sees the open models alone.
        bob = httpx.get(gateway.url + "/api/status", headers={"authorization": f"Bearer {BOB}"})
        assert bob.status_code == 401


def test_the_model_list_asks_for_a_key_when_every_model_needs_one(gateway, workers):
    spec = base_spec(workers, gateway.port)
    spec["routes"] = [r for r in spec["routes"] if r["name"] == "beta"]
    with pushed(gateway, spec):
        r = httpx.get(gateway.url + "/api/models")
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(gateway.url + "/api/models", headers={"x-api-key": BOB}).status_code == 401
        keyed = httpx.get(gateway.url + "/api/models", headers={"x-api-key": ALICE})
        assert [m["id"] for m in keyed.json()["data"]] == ["beta"]


def test_workers_believe_the_client_the_gateway_names_and_no_local_program(gateway, workers):
    # An entry as the daemon hands it out with a gateway section: the daemon's token, no trusted loopback.
    sock = Path(tempfile.mkdtemp(prefix="vllmmlxd-gwtok-")) / "w.sock"
    port = free_port()
    worker = start_serve("builtin:tiny", "--health-socket", str(sock), port=port, threads=None)
    try:
        config = parse_config(
            f"gateway: {{trusted_proxies: [127.0.0.1]}}\nmodels:\n"
            f"  m: {{model: builtin:tiny, served_model_name: tiny-m, port: {port}, rate_limit: 1}}\n"
        ).config
        entry = config.models["m"]
        ok, detail = asyncio.run(push_settings(sock, entry))
        assert ok, detail
        small = {"model": "tiny-m", "prompt": "x", "max_tokens": 2}
        # Straight to the worker's port: one client (this machine), whatever its headers claim.
        direct = [
            httpx.post(
                worker.url + "/v1/completions",
                json=small,
                timeout=60,
                headers={
                    "x-forwarded-for": f"9.9.6.{i}",
                    "x-vllmmlxd-client": f"9.9.6.{i}",
                    "x-vllmmlxd-gateway-token": "guess",
                },
            ).status_code
            for i in range(2)
        ]
        assert direct == [200, 429]
        token = entry.gateway_token.get_secret_value()
        spec = GatewaySpec.model_validate(
            {
                **base_spec(workers, gateway.port),
                "gateway": {"host": "127.0.0.1", "port": gateway.port, "trusted_proxies": ["127.0.0.1"]},
            }
        )
        spec = spec.model_copy(update={"routes": (build_route("m", entry, "ready", None),)})
        with pushed(gateway, spec):
            # Through the gateway (which believes this test's X-Forwarded-For): each client its own budget.
            via = [
                httpx.post(
                    gateway.url + "/v1/completions", json=small, timeout=60, headers={"x-forwarded-for": f"9.9.5.{i}"}
                ).status_code
                for i in (1, 2, 1)
            ]
            assert via == [200, 200, 429]
        assert token not in worker.log() and token not in gateway.log()
    finally:
        assert worker.stop() == 0, worker.log()[-3000:]


def test_a_request_for_a_starting_model_waits_for_the_push_that_shows_it_ready(gateway, workers):
    spec = base_spec(workers, gateway.port)
    spec["routes"][0]["state"] = "starting"
    with pushed(gateway, spec), gateway.private() as private, cf.ThreadPoolExecutor(1) as pool:
        answer = pool.submit(chat, oai(gateway), "tiny-a")
        deadline = time.monotonic() + 10
        while private.get("/health").json()["load"]["requests"] == 0:  # the request waits in the gateway
            assert time.monotonic() < deadline and not answer.done(), answer.result()
            time.sleep(0.02)
        spec["routes"][0]["state"] = "ready"
        assert private.post("/internal/settings", json=spec).status_code == 200
        assert answer.result(timeout=30).model == "tiny-a"
