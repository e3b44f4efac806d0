"""One set of error handlers for a worker, shaping each error as the family of its route does.

Serving code raises from the ``errors`` hierarchy; the route's path says which family answers:
``/v1/messages...`` is Anthropic's (``{"type": "error", "error": {...}}``, with Anthropic's
status and type pairs), everything else OpenAI's (``{"error": {"message", "type", "param", "code"}}``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..errors import Overloaded, RateLimited, RequestError
from ..log import log_event
from .body import ClientDisconnected

logger = logging.getLogger("vllmmlxd.api")

_HTTP_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
}
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


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestError)
    async def _request_error(request: Request, exc: RequestError):
        # SDKs read Retry-After to pace their retries.
        headers: Mapping[str, str] | None
        if isinstance(exc, RateLimited):
            headers = exc.headers
        else:
            headers = {"Retry-After": str(exc.retry_after)} if isinstance(exc, Overloaded) else None
        return render_error(request, exc.status_code, exc.message, exc.error_type, exc.param, exc.code, headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        err = exc.errors()[0] if exc.errors() else {"msg": "invalid request", "loc": ()}
        param = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or None
        return render_error(request, 400, str(err["msg"]), "invalid_request_error", param)

    @app.exception_handler(ClientDisconnected)
    async def _gone(request: Request, exc: ClientDisconnected):
        return Response(status_code=499)  # nobody reads it; it marks the request in traces

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException):
        message = exc.detail if isinstance(exc.detail, str) else "request failed"
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}"
        type_ = _HTTP_TYPES.get(exc.status_code, "invalid_request_error")
        return render_error(request, exc.status_code, message, type_, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        rid = getattr(request.state, "request_id", None)
        log_event(logger, "request.failed", logging.ERROR, path=request.url.path, error=repr(exc), request_id=rid)
        # Answered outside the middlewares (Starlette's outermost layer): the id header goes on here.
        return render_error(
            request, 500, "internal server error", "server_error", headers={"x-request-id": rid} if rid else None
        )
