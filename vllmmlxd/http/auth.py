"""API keys as clients present them: ``Authorization: Bearer KEY`` or ``x-api-key: KEY``."""

from __future__ import annotations

import secrets

from pydantic import SecretStr
from starlette.requests import Request


def presented_key(request: Request) -> str | None:
    """The key a request carries: ``Authorization: Bearer KEY``, else ``x-api-key``."""
    auth = request.headers.get("authorization", "")
    given = auth[7:].strip() if auth.lower().startswith("bearer ") else request.headers.get("x-api-key", "")
    return given or None


def key_matches(given: str | None, expected: SecretStr) -> bool:
    """Constant-time comparison, so response timing does not leak the key."""
    return given is not None and secrets.compare_digest(given.encode(), expected.get_secret_value().encode())
