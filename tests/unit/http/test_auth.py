"""API keys: taken from either header, compared in constant time."""

from __future__ import annotations

import secrets

from pydantic import SecretStr
from starlette.requests import Request

from vllmmlxd.http import auth


def request(headers: dict[str, str]) -> Request:
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    return Request({"type": "http", "headers": raw, "method": "GET", "path": "/"})


def test_either_header_carries_the_key():
    assert auth.presented_key(request({"Authorization": "Bearer k1"})) == "k1"
    assert auth.presented_key(request({"x-api-key": "k2"})) == "k2"
    assert auth.presented_key(request({})) is None


def test_keys_are_compared_in_constant_time(monkeypatch):
    calls = []
    real = secrets.compare_digest
    monkeypatch.setattr(auth.secrets, "compare_digest", lambda a, b: calls.append((a, b)) or real(a, b))
    assert auth.key_matches("right", SecretStr("right")) and not auth.key_matches("wrong", SecretStr("right"))
    assert len(calls) == 2  # never a plain ==, whose time depends on the first differing byte
    assert not auth.key_matches(None, SecretStr("right"))
