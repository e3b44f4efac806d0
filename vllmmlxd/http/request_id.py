"""Every response carries ``x-request-id``: the client's own, or one the server made.

A route that has a response id (``chatcmpl-...``, ``msg_...``) makes it the request's id, so
the header, the body's ``id`` and the logs' ``request_id`` are the same string, and a user
can match a client error to a log line.
"""

from __future__ import annotations

import re
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADER = b"x-request-id"
# Kept when it is safe to echo and log: printable, no spaces, bounded.
_ACCEPTABLE = re.compile(r"^[A-Za-z0-9._:/+=@-]{1,128}$")


def new_request_id(prefix: str = "req_") -> str:
    return prefix + uuid.uuid4().hex


def client_request_id(scope: Scope) -> str | None:
    """The client's ``x-request-id`` when it is acceptable, else None."""
    for name, value in scope.get("headers", ()):
        if name.lower() == HEADER:
            text = value.decode("latin-1")
            return text if _ACCEPTABLE.match(text) else None
    return None


class RequestIdMiddleware:
    """Pure ASGI: puts the request's id in ``scope["state"]["request_id"]`` and on the response."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        client = client_request_id(scope)
        if client:
            state["client_request_id"] = client
        state["request_id"] = client or new_request_id()  # a route may give it its family's prefix

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                rid = state["request_id"]
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != HEADER]
                message = {**message, "headers": [*headers, (HEADER, rid.encode("latin-1"))]}
            await send(message)

        await self.app(scope, receive, send_with_id)
