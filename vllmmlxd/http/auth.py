"""API keys as clients present them (``Authorization: Bearer KEY`` or ``x-api-key: KEY``), and the
check every API route gets as a router dependency, so a new route cannot forget it."""

from __future__ import annotations

import secrets

from typing import Awaitable, Callable

from pydantic import SecretStr
from starlette.requests import Request

from ..errors import Unauthorized


def presented_key(request: Request) -> str | None:
    """The key a request carries: ``Authorization: Bearer KEY``, else ``x-api-key``."""
    auth = request.headers.get("authorization", "")
    given = auth[7:].strip() if auth.lower().startswith("bearer ") else request.headers.get("x-api-key", "")
    return given or None


def key_matches(given: str | None, expected: SecretStr) -> bool:
    """Constant-time comparison, so response timing does not leak the key."""
    return given is not None and secrets.compare_digest(given.encode(), expected.get_secret_value().encode())


def require_key(request: Request, api_key: SecretStr | None) -> None:
    """Raise 401 unless the request carries ``api_key``; nothing to check without one."""
    if api_key is not None and not key_matches(presented_key(request), api_key):
        raise Unauthorized("missing or invalid API key", code="invalid_api_key")


def make_auth(api_key: SecretStr | None) -> Callable[[Request], Awaitable[None]]:
    """A FastAPI dependency over a fixed key: 401 unless the request carries ``api_key``."""

    async def check(request: Request) -> None:
        require_key(request, api_key)

    return check
