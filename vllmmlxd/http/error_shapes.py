"""The two error shapes a client may be answered in, chosen by the route's family. Pure.

``/v1/messages...`` is Anthropic's (``{"type": "error", "error": {...}}``, with Anthropic's
status and type pairs), everything else OpenAI's (``{"error": {"message", "type", "param",
"code"}}``). Here, below the API families, so that middleware (browser defences) and the
gateway answer in the same shapes as the routes' handlers (``api.errors``).
"""

from __future__ import annotations

from collections.abc import Mapping

from starlette.requests import Request
from starlette.responses import JSONResponse

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


def is_anthropic(request: Request) -> bool:
    return request.url.path.startswith("/v1/messages")


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
    if is_anthropic(request):
        status = {422: 400, 503: 529}.get(status, status)  # Anthropic has no 422; "overloaded" is 529
        kind = "overloaded_error" if status == 529 else _ANTHROPIC.get(status, "api_error")
        return JSONResponse(anthropic_error(message, kind), status_code=status, headers=headers)
    return JSONResponse(openai_error(message, type_, param, code), status_code=status, headers=headers)
