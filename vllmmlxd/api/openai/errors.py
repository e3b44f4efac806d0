"""One handler that shapes every error of a worker as OpenAI's ``{"error": {...}}``."""

from __future__ import annotations

import logging

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ...errors import Overloaded, RateLimited, RequestError
from ...log import log_event
from ..body import ClientDisconnected
from .protocol import error_body

logger = logging.getLogger("vllmmlxd.api")

_HTTP_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error", 405: "invalid_request_error"}


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestError)
    async def _request_error(request: Request, exc: RequestError):
        # OpenAI's SDKs read Retry-After to pace their retries.
        headers = {"Retry-After": str(exc.retry_after)} if isinstance(exc, (RateLimited, Overloaded)) else None
        return JSONResponse(
            error_body(exc.message, exc.error_type, exc.param, exc.code), status_code=exc.status_code, headers=headers
        )

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        err = exc.errors()[0] if exc.errors() else {"msg": "invalid request", "loc": ()}
        param = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or None
        return JSONResponse(error_body(err["msg"], "invalid_request_error", param), status_code=400)

    @app.exception_handler(ClientDisconnected)
    async def _gone(request: Request, exc: ClientDisconnected):
        return Response(status_code=499)  # nobody reads it; it marks the request in traces

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException):
        message = exc.detail if isinstance(exc.detail, str) else "request failed"
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}"
        type_ = _HTTP_TYPES.get(exc.status_code, "invalid_request_error")
        return JSONResponse(error_body(message, type_), status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        log_event(logger, "request.failed", logging.ERROR, path=request.url.path, error=repr(exc))
        return JSONResponse(error_body("internal server error", "server_error"), status_code=500)
