"""The browser defences as an ASGI layer over a small app: Host, Origin, Content-Type, CORS."""

import asyncio

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from vllmmlxd.config.schema import ModelConfig
from vllmmlxd.http.browser import BrowserDefences, same_origin, split_host

BODY = b'{"messages": []}'


async def echo(request: Request):
    return JSONResponse({"got": (await request.body()).decode()})


async def stream(request: Request):
    async def chunks():
        for i in range(3):
            yield f"data: {i}\n\n"
            await asyncio.sleep(0)

    return StreamingResponse(chunks(), media_type="text/event-stream")


def call(
    config: ModelConfig, method: str, path: str, headers: dict, body: bytes | None = None, settings: dict | None = None
) -> httpx.Response:
    holder = {"config": config}
    app = Starlette(
        routes=[
            Route("/v1/chat/completions", echo, methods=["POST"]),
            Route("/v1/messages", echo, methods=["POST"]),
            Route("/v1/stream", stream),
            Route("/health", lambda r: JSONResponse({"ok": 1})),
        ]
    )
    app.add_middleware(BrowserDefences, config=lambda: holder["config"])

    async def run():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1:8000") as c:
            if settings:  # a settings change between two requests
                await c.get("/health")
                holder["config"] = config.model_copy(update=settings)
            return await c.request(method, path, headers=headers, content=body)

    return asyncio.run(run())


LOCAL = ModelConfig(model="x")


@pytest.mark.parametrize("host", ["127.0.0.1:8000", "localhost:8000", "LOCALHOST", "[::1]:8000", "localhost."])
def test_loopback_hosts_are_served(host):
    assert call(LOCAL, "GET", "/health", {"host": host}).status_code == 200


@pytest.mark.parametrize("host", ["evil.example:8000", "0.0.0.0:8000", "127.0.0.1.evil.example", "[::2]:8000"])
def test_a_rebound_host_is_a_403_naming_it_and_allowed_hosts(host):
    r = call(LOCAL, "POST", "/v1/chat/completions", {"host": host, "content-type": "application/json"}, BODY)
    assert r.status_code == 403
    err = r.json()["error"]
    assert err["type"] == "permission_error"
    assert split_host(host)[0] in err["message"] and "allowed_hosts" in err["message"]


def test_refusals_take_the_anthropic_shape_on_messages():
    r = call(LOCAL, "POST", "/v1/messages", {"host": "evil.example", "content-type": "application/json"}, BODY)
    assert r.status_code == 403 and r.json()["type"] == "error"
    assert r.json()["error"]["type"] == "permission_error"


def test_allowed_hosts_and_the_bind_address_are_served_case_insensitively():
    config = ModelConfig(model="x", host="192.168.1.5", allowed_hosts=("Studio.Local", "*.lan"))
    for host in ("192.168.1.5:8000", "studio.local:8000", "STUDIO.LOCAL", "mac.lan"):
        assert call(config, "GET", "/health", {"host": host}).status_code == 200, host
    assert call(config, "GET", "/health", {"host": "other.local"}).status_code == 403


def test_a_wildcard_bind_takes_any_host_until_allowed_hosts_is_set():
    anywhere = ModelConfig(model="x", host="0.0.0.0")
    assert call(anywhere, "GET", "/health", {"host": "whatever.example"}).status_code == 200
    listed = ModelConfig(model="x", host="::", allowed_hosts=("box",))
    assert call(listed, "GET", "/health", {"host": "whatever.example"}).status_code == 403
    assert call(listed, "GET", "/health", {"host": "box:1"}).status_code == 200


def test_allowed_hosts_is_read_per_request():
    r = call(LOCAL, "GET", "/health", {"host": "box.example"}, settings={"allowed_hosts": ("box.example",)})
    assert r.status_code == 200


@pytest.mark.parametrize("origin", ["https://evil.example", "null", "http://localhost:8001", "http://127.0.0.1"])
def test_a_foreign_origin_is_refused(origin):
    r = call(LOCAL, "POST", "/v1/chat/completions", {"origin": origin, "content-type": "application/json"}, BODY)
    assert r.status_code == 403 and "cors_origins" in r.json()["error"]["message"]
    assert "access-control-allow-origin" not in r.headers


def test_the_servers_own_origin_is_served():
    r = call(
        LOCAL,
        "POST",
        "/v1/chat/completions",
        {"origin": "http://127.0.0.1:8000", "content-type": "application/json"},
        BODY,
    )
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


def test_under_any_host_a_rebound_name_is_not_its_own_origin():
    anywhere = ModelConfig(model="x", host="0.0.0.0")
    r = call(
        anywhere,
        "POST",
        "/v1/chat/completions",
        {"host": "evil.example:8000", "origin": "http://evil.example:8000", "content-type": "application/json"},
        BODY,
    )
    assert r.status_code == 403


def test_same_origin_compares_host_and_port_with_default_ports():
    assert same_origin("http://example.com", "example.com:80", "http")
    assert same_origin("https://Example.com", "example.com:443", "http")
    assert not same_origin("http://example.com:8080", "example.com:8000", "http")
    assert not same_origin("null", "example.com", "http")


@pytest.mark.parametrize(
    "content_type",
    ["application/json", "application/json; charset=utf-8", "Application/JSON", "application/vnd.api+json"],
)
def test_json_bodies_are_served(content_type):
    r = call(
        LOCAL, "POST", "/v1/chat/completions", {"content-type": content_type, "sec-fetch-site": "same-origin"}, BODY
    )
    assert r.status_code == 200 and r.json()["got"] == BODY.decode()


@pytest.mark.parametrize("headers", [{}, {"content-type": "application/x-www-form-urlencoded"}])
def test_curl_without_a_json_type_still_works(headers):
    r = call(LOCAL, "POST", "/v1/chat/completions", headers, BODY)
    assert r.status_code == 200 and r.json()["got"] == BODY.decode()


@pytest.mark.parametrize(
    "headers",
    [
        {"content-type": "text/plain"},
        {"content-type": "multipart/form-data; boundary=x"},
        {"content-type": "application/x-www-form-urlencoded", "sec-fetch-mode": "no-cors"},
        {"content-type": "application/x-www-form-urlencoded", "sec-fetch-site": "cross-site"},
        {"sec-fetch-site": "same-origin"},
    ],
)
def test_other_body_types_are_a_415_saying_what_to_send(headers):
    r = call(LOCAL, "POST", "/v1/chat/completions", headers, BODY)
    assert r.status_code == 415
    assert "Content-Type: application/json" in r.json()["error"]["message"]


CORS = ModelConfig(model="x", cors_origins=("https://app.example",))
PREFLIGHT = {
    "origin": "https://app.example",
    "access-control-request-method": "POST",
    "access-control-request-headers": "authorization, content-type, anthropic-version",
}


def test_no_cors_headers_unless_origins_are_configured():
    r = call(LOCAL, "GET", "/health", {"origin": "http://127.0.0.1:8000"})
    assert r.status_code == 200 and not any(h.startswith("access-control-") for h in r.headers)


def test_a_preflight_from_a_listed_origin_is_answered():
    r = call(CORS, "OPTIONS", "/v1/chat/completions", PREFLIGHT)
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == "https://app.example"
    assert "authorization" in r.headers["access-control-allow-headers"].lower()


def test_a_listed_origin_gets_cors_headers_and_an_unlisted_one_a_403():
    r = call(
        CORS,
        "POST",
        "/v1/chat/completions",
        {"origin": "https://app.example", "content-type": "application/json"},
        BODY,
    )
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://app.example"
    assert "x-request-id" in r.headers["access-control-expose-headers"]
    assert "retry-after" in r.headers["access-control-expose-headers"]
    other = call(CORS, "OPTIONS", "/v1/chat/completions", {**PREFLIGHT, "origin": "https://evil.example"})
    assert other.status_code == 403 and "access-control-allow-origin" not in other.headers


def test_a_listed_page_can_read_a_415():
    r = call(
        CORS, "POST", "/v1/chat/completions", {"origin": "https://app.example", "content-type": "text/plain"}, BODY
    )
    assert r.status_code == 415 and r.headers["access-control-allow-origin"] == "https://app.example"


def test_cors_origins_is_read_per_request():
    r = call(LOCAL, "OPTIONS", "/v1/chat/completions", PREFLIGHT, settings={"cors_origins": ("https://app.example",)})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://app.example"
    gone = call(CORS, "OPTIONS", "/v1/chat/completions", PREFLIGHT, settings={"cors_origins": ()})
    assert gone.status_code == 403


def test_streams_pass_through_whole():
    r = call(CORS, "GET", "/v1/stream", {"origin": "https://app.example"})
    assert r.status_code == 200 and r.text == "data: 0\n\ndata: 1\n\ndata: 2\n\n"
    assert r.headers["access-control-allow-origin"] == "https://app.example"
