"""Every response carries ``x-request-id``: the client's own, or one the server made.

A route that has a response id (``chatcmpl-...``, ``msg_...``) makes it the request's id, so
the header, the body's ``id`` and the logs' ``request_id`` are the same string, and a user
can match a client error to a log line.
"""

from __future__ import annotations

import re
import uuid

from starlette.types import Scope

from .response_headers import Headers, ResponseHeaders, replaced

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


class RequestIdMiddleware(ResponseHeaders):
    """Puts the request's id in ``scope["state"]["request_id"]`` and on the response."""

    def prepare(self, scope: Scope) -> None:
        state = scope.setdefault("state", {})
        client = client_request_id(scope)
        if client:
            state["client_request_id"] = client
        state["request_id"] = client or new_request_id()  # a route may give it its family's prefix

    def headers(self, scope: Scope, headers: Headers) -> Headers:
        return replaced(headers, HEADER, scope["state"]["request_id"].encode("latin-1"))
