"""The error shapes a client may be answered in, chosen by the route's family. Pure.

``/v1/messages...`` is Anthropic's (``{"type": "error", "error": {...}}``, with Anthropic's
status and type pairs), ``/ollama/...`` (a worker's Ollama routes) Ollama's (``{"error":
"message"}``), everything else OpenAI's (``{"error": {"message", "type", "param", "code"}}``).
An app whose paths do not say (the gateway's Ollama listener serves ``/api/chat``, as the
cluster's page does on the main port) names its family in the request's scope
(``ErrorFamily``). Here, below the API families, so that middleware (browser defences) and the
gateway answer in the same shapes as the routes' handlers (``api.errors``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

Family = Literal["openai", "anthropic", "ollama"]
FAMILY_KEY = "vllmmlxd.error_family"  # a scope's own family, set by ErrorFamily
OLLAMA_PREFIX = "/ollama/"  # a worker's Ollama routes (api/ollama/routes.py)

# Anthropic's documented status/type pairs; an overloaded server is 529 there.
_ANTHROPIC = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
}


def openai_error(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def anthropic_error(message: str, type_: str) -> dict:
    """Anthropic's error shape."""
    return {"type": "error", "error": {"type": type_, "message": message}}


def ollama_error(message: str) -> dict:
    """Ollama's error shape: the message alone, as a body or as a line of an NDJSON stream."""
    return {"error": message}


def family(request: Request) -> Family:
    """Whose shape ``request``'s errors take: the scope's own family, else its path's."""
    named = request.scope.get(FAMILY_KEY)
    if named is not None:
        return named
    path = request.url.path
    if path.startswith("/v1/messages"):
        return "anthropic"
    return "ollama" if path.startswith(OLLAMA_PREFIX) else "openai"


def is_anthropic(request: Request) -> bool:
    return family(request) == "anthropic"


class ErrorFamily:
    """ASGI middleware naming the family every request of an app answers errors in, whatever its path."""

    def __init__(self, app: ASGIApp, family: Family):
        self.app, self.family = app, family

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope[FAMILY_KEY] = self.family
        await self.app(scope, receive, send)


def render_error(
    request: Request,
    status: int,
    message: str,
    type_: str,
    param: str | None = None,
    code: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """An error in the shape of the family ``request`` belongs to."""
    shape = family(request)
    if shape == "ollama":  # Ollama's clients read only the message; a missing field is a 400 there
        return JSONResponse(ollama_error(message), status_code=400 if status == 422 else status, headers=headers)
    if shape == "anthropic":
        status = {422: 400, 503: 529}.get(status, status)  # Anthropic has no 422; "overloaded" is 529
        kind = "overloaded_error" if status == 529 else _ANTHROPIC.get(status, "api_error")
        return JSONResponse(anthropic_error(message, kind), status_code=status, headers=headers)
    return JSONResponse(openai_error(message, type_, param, code), status_code=status, headers=headers)
