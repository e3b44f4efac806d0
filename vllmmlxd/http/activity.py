"""When a worker last served a request: what idle unloading reads.

An ASGI middleware counts the API requests in flight (paths under ``/v1/``; probes and
scrapes are not use) and stamps the time each one starts and ends. The daemon reads
``idle_s`` from the worker's private health answer and unloads a lazy model idle too long.
"""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Receive, Scope, Send


class Activity:
    """In-flight API requests and the monotonic time of the last start or end."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.last_at = time.monotonic()

    def idle_s(self, now: float | None = None) -> float:
        """Seconds without an API request: 0 while one runs, and never 0 when none does (the daemon
        reads 0 as busy: a model whose last request ended a moment ago may be unloaded for room)."""
        if self.in_flight:
            return 0.0
        return max(round((time.monotonic() if now is None else now) - self.last_at, 3), 0.001)


class ActivityMiddleware:
    def __init__(self, app: ASGIApp, activity: Activity):
        self.app = app
        self.activity = activity

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope.get("path", "").startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        activity = self.activity
        activity.in_flight += 1
        activity.last_at = time.monotonic()
        try:
            await self.app(scope, receive, send)
        finally:
            activity.in_flight -= 1
            activity.last_at = time.monotonic()
