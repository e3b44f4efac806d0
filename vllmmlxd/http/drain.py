"""Closing keep-alive connections without racing the client.

When a draining worker closes an idle keep-alive connection, a request the client is
sending at that moment is lost ("connection reset"). Instead, while draining, every
response says ``Connection: close``: busy clients reconnect (to the new worker) after
their response, idle connections end by the keep-alive timeout.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import ASGIApp, Scope

from .response_headers import Headers, ResponseHeaders, replaced


class CloseWhenDraining(ResponseHeaders):
    """Adds ``Connection: close`` to responses once ``draining()`` is true."""

    def __init__(self, app: ASGIApp, draining: Callable[[], bool]):
        super().__init__(app)
        self.draining = draining

    def headers(self, scope: Scope, headers: Headers) -> Headers:
        return replaced(headers, b"connection", b"close") if self.draining() else headers
