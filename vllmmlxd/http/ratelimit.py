"""Per-client request rate limits (``rate_limit`` requests per minute; 0: off).

A client is its API key when the key is valid here, else its address. The limiter
itself is plain logic over ``limits``; ``make_rate_limit`` wraps it as a FastAPI
dependency that raises ``RateLimited`` so the API family's handler shapes the 429.
"""

from __future__ import annotations

import hashlib
import math
import time
from typing import Awaitable, Callable

from limits import RateLimitItemPerMinute
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter
from pydantic import SecretStr
from starlette.requests import Request

from ..errors import RateLimited
from .auth import key_matches, presented_key


class RateLimiter:
    """At most ``per_minute`` hits per identity in any 60-second span."""

    def __init__(self, per_minute: int):
        self.per_minute = per_minute
        self._item = RateLimitItemPerMinute(per_minute)
        # A moving window never lets a client burst 2n requests across a fixed window's edge;
        # its cost (one timestamp per hit, n at most per client) is small at per-minute rates.
        self._limiter = MovingWindowRateLimiter(MemoryStorage())

    def hit(self, identity: str) -> int:
        """Spend one request of ``identity``: 0 if allowed, else whole seconds until a slot frees."""
        if self._limiter.hit(self._item, identity):
            return 0
        reset, _remaining = self._limiter.get_window_stats(self._item, identity)
        return max(1, math.ceil(reset - time.time()))

    def enforce(self, request: Request, api_key: SecretStr | None) -> None:
        """Spend one request of this client, or raise ``RateLimited`` with its Retry-After."""
        retry_after = self.hit(client_identity(request, api_key))
        if retry_after:
            raise RateLimited(
                f"rate limit of {self.per_minute} requests per minute reached; retry in {retry_after} s",
                retry_after=retry_after,
            )


def client_identity(request: Request, api_key: SecretStr | None) -> str:
    """``key:SHA256`` for a valid API key, else ``addr:HOST``.

    Keys count only where this server checks them: on a keyless server every SDK sends
    some dummy key, and a wrong key must not buy a fresh budget (guessing is limited by
    address). The key is hashed so the limiter's storage never holds the secret.
    """
    given = presented_key(request)
    if api_key is not None and key_matches(given, api_key):
        return "key:" + hashlib.sha256(given.encode()).hexdigest()
    return "addr:" + (request.client.host if request.client else "unknown")


def make_rate_limit(per_minute: int, api_key: SecretStr | None) -> Callable[[Request], Awaitable[None]]:
    """A FastAPI dependency for the API routes; a no-op when ``per_minute`` is 0."""
    limiter = RateLimiter(per_minute) if per_minute > 0 else None

    async def rate_limit(request: Request) -> None:
        if limiter is not None:
            limiter.enforce(request, api_key)

    return rate_limit
