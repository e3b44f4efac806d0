"""The streaming pass-through: a request's raw body to a worker, its answer back as it arrives.

The hot path stays lean: the body is sent as the client's bytes (never re-encoded), headers
are filtered once, and the answer's head goes out as soon as the worker's arrives, then each
chunk as it comes (``aiter_raw``: no decoding, no re-chunking). While a body streams, the
client's connection is watched: when it goes, the worker's response is closed at once, so the
worker sees its own client go and cancels the generation.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

import anyio
import httpx
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ..log import log_event

logger = logging.getLogger("vllmmlxd.gateway")

RawHeaders = list[tuple[bytes, bytes]]

# Headers of one connection, not of the message (RFC 9110 7.6.1), plus what httpx sets itself.
HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"te", b"trailer", b"transfer-encoding", b"upgrade"})
# The browser's own headers stop here: the gateway has checked the page's Origin (http/browser.py), and a
# worker would refuse an origin that is not its own. Cookies mean nothing to a worker.
_REQUEST_DROPPED = HOP_BY_HOP | {b"host", b"content-length", b"origin", b"referer", b"cookie"}
# uvicorn writes its own date and server headers; the worker's would be doubled.
_RESPONSE_DROPPED = HOP_BY_HOP | {b"date", b"server"}
CONNECT_TIMEOUT_S = 5.0


def _connection_tokens(headers: RawHeaders) -> set[bytes]:
    """Header names a ``Connection`` header declares hop-by-hop too."""
    named: set[bytes] = set()
    for k, v in headers:
        if k.lower() == b"connection":
            named.update(t.strip().lower() for t in v.split(b",") if t.strip())
    return named


def _dropped(name: bytes, fixed: frozenset[bytes], named: set[bytes]) -> bool:
    return name in fixed or name.startswith((b"proxy-", b"sec-fetch-")) or name in named


def request_headers(headers: RawHeaders, client: str, upstream_key: str | None = None) -> RawHeaders:
    """The headers to send on: hop-by-hop ones dropped, the client appended to X-Forwarded-For,
    and for an upstream with its own key, that key in place of the client's."""
    named = _connection_tokens(headers)
    out: RawHeaders = []
    forwarded: list[bytes] = []
    for name, value in headers:
        name = name.lower()
        if _dropped(name, _REQUEST_DROPPED, named):
            continue
        if name == b"x-forwarded-for":
            forwarded.append(value)
        elif upstream_key is None or name not in (b"authorization", b"x-api-key"):
            out.append((name, value))
    forwarded.append(client.encode("latin-1", "replace"))
    out.append((b"x-forwarded-for", b", ".join(forwarded)))
    if upstream_key is not None:
        out.append((b"authorization", b"Bearer " + upstream_key.encode("latin-1", "replace")))
    return out


def response_headers(headers: RawHeaders) -> RawHeaders:
    """The worker's response headers minus hop-by-hop ones (content-length stays: bytes pass raw)."""
    named = _connection_tokens(headers)
    return [(k.lower(), v) for k, v in headers if not _dropped(k.lower(), _RESPONSE_DROPPED, named)]


def new_client() -> httpx.AsyncClient:
    """The gateway's one client: a keep-alive pool to every worker, no env proxies, no redirects."""
    return httpx.AsyncClient(
        limits=httpx.Limits(max_connections=4096, max_keepalive_connections=512, keepalive_expiry=30),
        trust_env=False, follow_redirects=False,
    )


async def open_stream(client: httpx.AsyncClient, url: str, headers: RawHeaders, body: bytes,
                      timeout: float, method: str = "POST") -> httpx.Response:
    """Send the request; return once the response's head is in (its body still to read)."""
    request = client.build_request(method, url, headers=headers, content=body,
                                   timeout=httpx.Timeout(timeout, connect=CONNECT_TIMEOUT_S))
    return await client.send(request, stream=True)


async def until_disconnect(receive: Receive, work: Callable[[], Awaitable[bool]]) -> bool:
    """Run ``work`` while watching the client; cancel it when the client goes.

    ``work``'s answer, or False when the client went first. ``work`` runs in this task and a
    watcher beside it cancels this task when the client goes: one extra task per request,
    where a task group costs two and its cancel scopes (measured: about 0.1 ms a request on
    a 2-core machine, on the path of every first byte)."""
    task = asyncio.current_task()
    assert task is not None
    gone = False

    async def watch() -> None:
        nonlocal gone
        try:
            while (await receive())["type"] != "http.disconnect":
                pass
        except Exception:  # receive broke: the client cannot be heard any more, as if gone
            pass
        gone = True
        task.cancel()

    watcher = asyncio.get_running_loop().create_task(watch())
    try:
        result = await work()
        if gone:  # the client went just as the work ended: take the cancel that was meant for the work
            try:
                await asyncio.sleep(0)
            except asyncio.CancelledError:
                task.uncancel()
        return result
    except asyncio.CancelledError:
        # This watcher's cancel, and no one else's: the client went. Any other cancel goes on.
        if gone and task.uncancel() == 0:
            return False
        raise
    finally:
        watcher.cancel()


async def pump(upstream: httpx.Response, send: Send) -> bool:
    """Each chunk of ``upstream`` to the client as it arrives, then the end of the body; False if it broke.

    A worker that breaks off mid-body leaves the response unfinished: the client's connection
    is then cut rather than ended cleanly, so it cannot take half an answer for a whole one."""
    try:
        async for chunk in upstream.aiter_raw():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
    except httpx.HTTPError as exc:
        log_event(logger, "gateway.upstream_broke", logging.WARNING, url=str(upstream.request.url),
                  error=type(exc).__name__)
        return False
    await send({"type": "http.response.body", "body": b"", "more_body": False})
    return True


async def close_quietly(upstream: httpx.Response) -> None:
    with anyio.CancelScope(shield=True):  # even while cancelled: the worker must see the close
        await upstream.aclose()


class RawResponse(Response):
    """A Response that writes itself (``__call__``): FastAPI hands it over untouched."""

    def __init__(self) -> None:
        self.background = None  # FastAPI may attach background tasks: none run here

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:  # pragma: no cover
        raise NotImplementedError


class Relay(RawResponse):
    """An ASGI response relaying one open upstream response; ``done(status, completed)`` when over."""

    def __init__(self, upstream: httpx.Response, done: Callable[[int, bool], None]):
        super().__init__()
        self.upstream = upstream
        self.done = done

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        upstream = self.upstream
        completed = False
        try:
            request_id = upstream.headers.get("x-request-id")
            if request_id:  # the worker's id (chatcmpl-...) is the one its body and logs carry
                scope.setdefault("state", {})["request_id"] = request_id
            await send({"type": "http.response.start", "status": upstream.status_code,
                        "headers": response_headers(upstream.headers.raw)})
            # Unfinished (client gone, worker broke off): uvicorn cuts the connection.
            completed = await until_disconnect(receive, lambda: pump(upstream, send))
        finally:
            await close_quietly(upstream)
            self.done(upstream.status_code, completed)
