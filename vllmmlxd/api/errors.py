"""One set of error handlers for a worker, shaping each error as the family of its route does.

Serving code raises from the ``errors`` hierarchy; the route's path says which family answers:
``/v1/messages...`` is Anthropic's (``{"type": "error", "error": {...}}``, with Anthropic's
status and type pairs), everything else OpenAI's (``{"error": {"message", "type", "param", "code"}}``);
Ollama's routes answer Ollama's ``{"error": "..."}`` (the shapes are in ``http/error_shapes.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from ..errors import Overloaded, RateLimited, RequestError
from ..http.error_shapes import anthropic_error, is_anthropic, openai_error, render_error  # noqa: F401 - the families' shapes
from ..log import log_event
from .body import ClientDisconnected

logger = logging.getLogger("vllmmlxd.api")

_HTTP_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
}


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestError)
    async def _request_error(request: Request, exc: RequestError) -> Response:
        # SDKs read Retry-After to pace their retries.
        headers: Mapping[str, str] | None
        if isinstance(exc, RateLimited):
            headers = exc.headers
        else:
            headers = {"Retry-After": str(exc.retry_after)} if isinstance(exc, Overloaded) else None
        return render_error(request, exc.status_code, exc.message, exc.error_type, exc.param, exc.code, headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> Response:
        err = exc.errors()[0] if exc.errors() else {"msg": "invalid request", "loc": ()}
        param = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or None
        return render_error(request, 400, str(err["msg"]), "invalid_request_error", param)

    @app.exception_handler(ClientDisconnected)
    async def _gone(request: Request, exc: ClientDisconnected) -> Response:
        return Response(status_code=499)  # nobody reads it; it marks the request in traces

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> Response:
        message = exc.detail if isinstance(exc.detail, str) else "request failed"
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}"
        type_ = _HTTP_TYPES.get(exc.status_code, "invalid_request_error")
        return render_error(request, exc.status_code, message, type_, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        rid = getattr(request.state, "request_id", None)
        log_event(logger, "request.failed", logging.ERROR, path=request.url.path, error=repr(exc), request_id=rid)
        # Answered outside the middlewares (Starlette's outermost layer): the id header goes on here.
        return render_error(
            request, 500, "internal server error", "server_error", headers={"x-request-id": rid} if rid else None
        )
