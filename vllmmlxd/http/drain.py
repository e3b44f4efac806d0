"""Closing keep-alive connections without racing the client.

When a draining worker closes an idle keep-alive connection, a request the client is
sending at that moment is lost ("connection reset"). Instead, while draining, every
response says ``Connection: close``: busy clients reconnect (to the new worker) after
their response, idle connections end by the keep-alive timeout.
"""

from __future__ import annotations

from typing import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class CloseWhenDraining:
    """ASGI middleware: adds ``Connection: close`` to responses once ``draining()`` is true."""

    def __init__(self, app: ASGIApp, draining: Callable[[], bool]):
        self.app = app
        self.draining = draining

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_closing(message: Message) -> None:
            if message["type"] == "http.response.start" and self.draining():
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"connection"]
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        await self.app(scope, receive, send_closing)
