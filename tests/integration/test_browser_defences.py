"""A web page against a real worker (`vllmmlxd serve builtin:tiny`): what a browser can send
to a loopback, keyless API is refused before the model runs; curl and SDKs are served as before."""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path

import httpx
import pytest

from tests.support.servers import free_port, start_serve
from vllmmlxd.config.schema import ResolvedModel
from vllmmlxd.supervisor.live import push_settings

MODEL = "builtin:tiny"
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
APP = "https://app.example"


@pytest.fixture(scope="module")
def server():
    folder = Path(tempfile.mkdtemp(prefix="vllmmlxd-browser-"))
    sock, port = folder / "w.sock", free_port()
    s = start_serve(MODEL, "--health-socket", str(sock), port=port, threads=None)
    yield s, sock, ResolvedModel(model=MODEL, served_model_name=MODEL, port=port)
    assert s.stop() == 0, s.log()[-3000:]


def processed(url: str) -> int:
    return httpx.get(url + "/v1/status", timeout=10).json()["total_requests_processed"]


def push(sock: Path, config: ResolvedModel) -> None:
    ok, error = asyncio.run(push_settings(sock, config))
    assert ok, error


def test_a_pages_simple_request_is_refused_before_the_model_runs(server):
    s, _, _ = server
    before = processed(s.url)
    # What <form> or fetch(..., {mode: "no-cors"}) sends: no preflight, so the server must refuse.
    page = {"origin": "https://evil.example", "sec-fetch-site": "cross-site", "sec-fetch-mode": "no-cors"}
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=b"):
        r = httpx.post(
            s.url + "/v1/chat/completions",
            content=json.dumps(CHAT),
            headers={**page, "content-type": content_type},
            timeout=30,
        )
        assert r.status_code == 403, r.text
        assert "cors_origins" in r.json()["error"]["message"] and "access-control-allow-origin" not in r.headers
    assert processed(s.url) == before


def test_a_rebound_host_is_refused_in_each_familys_shape(server):
    s, _, _ = server
    rebound = {"host": f"evil.example:{s.port}", "origin": f"http://evil.example:{s.port}"}
    r = httpx.post(s.url + "/v1/chat/completions", json=CHAT, headers=rebound, timeout=30)
    assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
    assert "evil.example" in r.json()["error"]["message"] and "allowed_hosts" in r.json()["error"]["message"]
    r = httpx.post(s.url + "/v1/messages", json=CHAT, headers=rebound, timeout=30)
    assert r.status_code == 403 and r.json()["type"] == "error" and "allowed_hosts" in r.json()["error"]["message"]
    assert httpx.get(s.url + "/health", headers={"host": "evil.example"}).status_code == 403
    assert httpx.get(s.url + "/health", headers={"host": f"localhost:{s.port}"}).status_code == 200


def test_curl_style_requests_are_served_and_other_body_types_get_a_415(server):
    s, _, _ = server
    assert httpx.get(s.url + "/health").status_code == 200
    body = json.dumps(CHAT).encode()
    # curl -d sends application/x-www-form-urlencoded; a bare socket client may send none.
    for headers in ({"content-type": "application/x-www-form-urlencoded"}, {}):
        r = httpx.post(s.url + "/v1/chat/completions", content=body, headers=headers, timeout=30)
        assert r.status_code == 200 and r.json()["choices"], r.text
    for content_type in ("text/plain", "multipart/form-data; boundary=b"):
        r = httpx.post(s.url + "/v1/chat/completions", content=body, headers={"content-type": content_type}, timeout=30)
        assert r.status_code == 415 and "Content-Type: application/json" in r.json()["error"]["message"]
    r = httpx.post(
        s.url + "/v1/chat/completions",
        content=body,
        timeout=30,
        headers={"content-type": "application/json; charset=utf-8", "sec-fetch-site": "same-origin"},
    )
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


def test_live_cors_origins_and_allowed_hosts(server):
    s, sock, base = server
    preflight = {
        "origin": APP,
        "access-control-request-method": "POST",
        "access-control-request-headers": "content-type, authorization, anthropic-version",
    }
    assert httpx.options(s.url + "/v1/chat/completions", headers=preflight).status_code == 403
    key = "sk-browser-test"
    push(
        sock,
        ResolvedModel(
            **{
                **base.model_dump(exclude_defaults=True),
                "cors_origins": (APP,),
                "allowed_hosts": ("studio.example",),
                "api_key": key,
            }
        ),
    )
    try:
        # The preflight carries no key (browsers never send one there) and is answered.
        r = httpx.options(s.url + "/v1/chat/completions", headers=preflight)
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == APP
        assert "authorization" in r.headers["access-control-allow-headers"].lower()
        auth = {"origin": APP, "authorization": f"Bearer {key}"}
        with httpx.stream(
            "POST", s.url + "/v1/chat/completions", json={**CHAT, "stream": True}, headers=auth, timeout=60
        ) as r:
            assert r.status_code == 200 and r.headers["access-control-allow-origin"] == APP
            assert "x-request-id" in r.headers["access-control-expose-headers"]
            lines = [line for line in r.iter_lines() if line.startswith("data:")]
        assert lines[-1] == "data: [DONE]" and len(lines) > 2
        assert httpx.post(s.url + "/v1/chat/completions", json=CHAT, headers={"origin": APP}).status_code == 401
        other = httpx.options(s.url + "/v1/chat/completions", headers={**preflight, "origin": "https://evil.example"})
        assert other.status_code == 403 and "access-control-allow-origin" not in other.headers
        assert httpx.get(s.url + "/health", headers={"host": "Studio.Example"}).status_code == 200
    finally:
        push(sock, base)
    assert httpx.options(s.url + "/v1/chat/completions", headers=preflight).status_code == 403
    assert httpx.get(s.url + "/health", headers={"host": "studio.example"}).status_code == 403
