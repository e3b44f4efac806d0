"""One log line per request, as inference servers and uvicorn's access log write them.

``event=request.served request_id=chatcmpl-... method=POST route=/v1/chat/completions
status=200 model=llama prompt_tokens=812 cached_tokens=768 completion_tokens=64 ttft_s=0.142
duration_s=1.906``: at info for API requests, at debug for probes and scrapes (``/health``,
``/metrics``), which would otherwise fill the journal. Only ids, counts and times: never a
prompt, an answer, a header, a query string or a key. A generation's numbers are what the
API layer left in ``scope["state"]`` under ``SERVED`` (``api.stream``); a streamed response is
logged when its last byte is sent, so its duration is the whole stream's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..log import log_event

logger = logging.getLogger("vllmmlxd.access")

SERVED = "served"  # scope["state"] key: the generation's token counts and time to first token
QUIET_PATHS = ("/health", "/metrics")  # polled: logged at debug
TOKEN_FIELDS = ("prompt_tokens", "cached_tokens", "completion_tokens", "ttft_s")


def served_fields(state: dict[str, Any]) -> dict[str, Any]:
    """The generation's fields of the line (none for a request that generated nothing)."""
    served = state.get(SERVED)
    if not isinstance(served, dict):
        return {}
    return {k: served.get(k) for k in TOKEN_FIELDS}


class AccessLogMiddleware:
    """Logs each HTTP request once it is answered (or failed); ``model`` names the model entry."""

    def __init__(
        self, app: ASGIApp, model: Callable[[], str], record: Callable[[dict, str, str, int], None] | None = None
    ):
        self.app = app
        self.model = model
        self.record = record  # also told of each answered request (its state, method, path, status): usage

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        status: int | None = None
        logged = False

        def log(final_status: int) -> None:
            nonlocal logged
            if logged:
                return
            logged = True
            state = scope.get("state") or {}
            path = scope.get("path", "")
            level = logging.DEBUG if path in QUIET_PATHS else logging.INFO
            log_event(
                logger,
                "request.served",
                level,
                request_id=state.get("request_id"),
                method=scope.get("method"),
                route=path,
                status=final_status,
                model=self.model(),
                **served_fields(state),
                duration_s=round(time.monotonic() - started, 3),
            )
            if self.record is not None:
                self.record(state, scope.get("method", ""), path, final_status)

        async def watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                log(status or 200)

        try:
            await self.app(scope, receive, watch)
        except BaseException:
            log(status or 500)  # the error handler outside answers 500; a disconnect ends here too
            raise
        log(status or 499)  # no body ever sent: the client went away first
