"""One shape for the middlewares that add headers to every response (request id, draining,
rate limits): pure ASGI, so streamed responses keep streaming, and only the start of the
response is touched."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

Headers = list[tuple[bytes, bytes]]


class ResponseHeaders:
    """Passes HTTP requests through; ``prepare`` runs first, ``headers`` rewrites the response's headers."""

    def __init__(self, app: ASGIApp):
        self.app = app

    def prepare(self, scope: Scope) -> None:
        """Called before the app sees the request."""

    def headers(self, scope: Scope, headers: Headers) -> Headers:
        """The response's headers, as they should go out."""
        return headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.prepare(scope)

        async def send_edited(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": self.headers(scope, list(message.get("headers", [])))}
            await send(message)

        await self.app(scope, receive, send_edited)


def replaced(headers: Headers, name: bytes, value: bytes) -> Headers:
    """``headers`` with ``name`` set to ``value`` (any earlier value dropped)."""
    return [(k, v) for k, v in headers if k.lower() != name] + [(name, value)]
