"""The rate limiter, the client identity and the dependency on a tiny inline app."""

from __future__ import annotations

import hashlib
import time

import pytest
from fastapi import Depends, FastAPI
from pydantic import SecretStr
from starlette.requests import Request
from starlette.testclient import TestClient

from vllmmlxd.api.errors import install_error_handlers
from vllmmlxd.http.ratelimit import RateLimiter, client_identity, make_rate_limit

KEY = "sk-unit-secret"


class Clock:
    def __init__(self, now: float = 1_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(time, "time", c)  # limits' MemoryStorage and the limiter both read time.time
    return c


def request(headers: dict[str, str] | None = None, client: tuple[str, int] | None = ("10.0.0.7", 5000)) -> Request:
    raw = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    return Request({"type": "http", "method": "GET", "path": "/v1/models", "headers": raw, "client": client})


def test_allows_n_then_refuses_with_a_retry_after():
    limiter = RateLimiter(3)
    assert [limiter.hit("a") for _ in range(3)] == [0, 0, 0]
    retry = limiter.hit("a")
    assert 0 < retry <= 60


def test_identities_are_independent():
    limiter = RateLimiter(2)
    assert [limiter.hit("a") for _ in range(2)] == [0, 0]
    assert limiter.hit("a") > 0
    assert limiter.hit("b") == 0


def test_retry_after_counts_down_to_the_oldest_hit_leaving_the_window(clock):
    limiter = RateLimiter(2)
    assert limiter.hit("a") == 0
    clock.now += 20
    assert limiter.hit("a") == 0
    clock.now += 10
    assert limiter.hit("a") == 30  # the first hit leaves the 60 s window in 30 s
    clock.now += 30.5
    assert limiter.hit("a") == 0  # one slot freed; the refused hit spent nothing
    assert limiter.hit("a") > 0


def test_a_valid_key_is_the_identity_hashed():
    expected = "key:" + hashlib.sha256(KEY.encode()).hexdigest()
    secret = SecretStr(KEY)
    assert client_identity(request({"Authorization": f"Bearer {KEY}"}), secret) == expected
    assert client_identity(request({"x-api-key": KEY}), secret) == expected
    assert KEY not in expected


def test_otherwise_the_address_is_the_identity():
    secret = SecretStr(KEY)
    assert client_identity(request({"Authorization": "Bearer wrong"}), secret) == "addr:10.0.0.7"
    assert client_identity(request(), secret) == "addr:10.0.0.7"
    # A keyless server: SDKs send a dummy key, which must not split or merge clients.
    assert client_identity(request({"Authorization": "Bearer not-needed"}), None) == "addr:10.0.0.7"
    assert client_identity(request(client=None), None) == "addr:unknown"


def make_app(per_minute: int) -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)
    limit = make_rate_limit(per_minute, SecretStr(KEY))

    @app.get("/v1/thing", dependencies=[Depends(limit)])
    async def thing():
        return {"ok": True}

    @app.get("/health")
    async def health():
        return {"ok": True}

    return app


def test_the_dependency_answers_429_in_openai_shape_with_retry_after():
    client = TestClient(make_app(2))
    auth = {"Authorization": f"Bearer {KEY}"}
    assert [client.get("/v1/thing", headers=auth).status_code for _ in range(2)] == [200, 200]
    r = client.get("/v1/thing", headers=auth)
    assert r.status_code == 429
    assert 0 < int(r.headers["retry-after"]) <= 60
    error = r.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("rate_limit_error", "rate_limit_exceeded", None)
    assert "2 requests per minute" in error["message"]
    assert client.get("/v1/thing").status_code == 200  # no key: the address has its own budget
    assert all(client.get("/health").status_code == 200 for _ in range(5))


def test_zero_turns_the_limit_off():
    client = TestClient(make_app(0))
    assert all(client.get("/v1/thing").status_code == 200 for _ in range(20))
