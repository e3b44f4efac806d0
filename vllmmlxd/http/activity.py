"""When a worker last served a request: what idle unloading reads.

An ASGI middleware counts the API requests in flight (paths under ``/v1/`` and the Ollama
routes' ``/ollama/``; probes and scrapes are not use) and stamps the time each one starts and
ends. The daemon reads ``idle_s`` from the worker's private health answer and unloads a lazy
model idle too long. A request may also say how long that is for it (Ollama's ``keep_alive``):
the last one said is ``keep_alive_s``, which the daemon takes over the entry's ``idle_unload_s``.
"""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Receive, Scope, Send

API_PREFIXES = ("/v1/", "/ollama/")  # the paths of the API families: what counts as use
# Asking what is there, what is loaded and until when keeps nothing loaded.
NOT_USE = frozenset({"/ollama/api/ps", "/ollama/api/tags", "/ollama/api/version"})
KEEP_FOREVER = -1.0  # keep_alive_s: a request asked for its model to stay loaded


def idle_limit(idle_unload_s: float | None, keep_alive_s: float | None) -> float | None:
    """How long a lazy model may stay idle: what its worker's last request asked for (Ollama's
    ``keep_alive``: seconds, or KEEP_FOREVER), else the entry's ``idle_unload_s`` (None: for ever)."""
    if keep_alive_s is None:
        return idle_unload_s
    return None if keep_alive_s < 0 else keep_alive_s


class Activity:
    """In-flight API requests and the monotonic time of the last start or end."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.last_at = time.monotonic()
        # The idle time after which the last request that said one wants the model unloaded: seconds,
        # KEEP_FOREVER (never), or None (nobody said: the entry's idle_unload_s).
        self.keep_alive_s: float | None = None

    def keep_alive(self, seconds: float | None) -> None:
        """What a request said of its model's idle time (None: nothing; the entry's own applies again)."""
        self.keep_alive_s = seconds

    def load(self, now: float | None = None) -> dict:
        """The figures the daemon's idle unloader reads: ``idle_s``, and ``keep_alive_s`` once a request said one."""
        figures: dict = {"idle_s": self.idle_s(now)}
        if self.keep_alive_s is not None:
            figures["keep_alive_s"] = self.keep_alive_s
        return figures

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
        path = scope.get("path", "")
        if scope["type"] != "http" or not path.startswith(API_PREFIXES) or path in NOT_USE:
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
