"""The streaming pass-through: a request's raw body to a worker, its answer back as it arrives.

The hot path stays lean: the body is sent as the client's bytes (never re-encoded), headers
are filtered once, and the answer's head goes out as soon as the worker's arrives, then each
chunk as it comes (no decoding, no re-chunking). While a body streams, the client's
connection is watched: when it goes, the worker's response is closed at once, so the worker
sees its own client go and cancels the generation.

Requests go through httpcore's connection pool (the layer httpx runs on) with a network
stream that sends a request's head and body in one write. Measured on 2 cores
(``bench/gateway.py``): httpx's client layers and the second send cost about 0.8 ms of the
first byte, more than the rest of the gateway's own work.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

import anyio
import httpcore
import httpx
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ..http.access import GATEWAY_CLIENT_HEADER, GATEWAY_TOKEN_HEADER
from ..log import log_event

logger = logging.getLogger("vllmmlxd.gateway")

RawHeaders = list[tuple[bytes, bytes]]

# Headers of one connection, not of the message (RFC 9110 7.6.1), plus what httpx sets itself.
HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"te", b"trailer", b"transfer-encoding", b"upgrade"})
# The browser's own headers stop here: the gateway has checked the page's Origin (http/browser.py), and a
# worker would refuse an origin that is not its own. Cookies mean nothing to a worker.
_REQUEST_DROPPED = HOP_BY_HOP | {b"host", b"content-length", b"origin", b"referer", b"cookie"}
# Written by the gateway alone: a client's own would claim to be the gateway.
_GATEWAY_HEADERS = (GATEWAY_TOKEN_HEADER.encode(), GATEWAY_CLIENT_HEADER.encode())
# A client's key is for this host: an upstream (another host's daemon) gets its own key or none.
_KEY_HEADERS = (b"authorization", b"x-api-key")
# Set on every response relayed through the gateway: the entry that answered (never on the gateway's own errors).
BACKEND_HEADER = b"x-vllmmlxd-backend"
# uvicorn writes its own date and server headers; the worker's would be doubled. A backend header from
# further on (an upstream that is itself a gateway) would name an entry of another config.
_RESPONSE_DROPPED = HOP_BY_HOP | {b"date", b"server", BACKEND_HEADER}
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


def request_headers(
    headers: RawHeaders,
    peer: str,
    *,
    upstream: bool = False,
    upstream_key: str | None = None,
    token: str | None = None,
    client: str | None = None,
) -> RawHeaders:
    """The headers to send on: hop-by-hop ones and any claiming to be the gateway dropped, the peer
    appended to X-Forwarded-For. To an ``upstream``: never the client's key, its own ``upstream_key``
    when it has one. To a local worker: the client's key, and with the daemon's ``token``, the
    ``client`` address this gateway judged (the worker believes it on the token's word alone)."""
    named = _connection_tokens(headers)
    out: RawHeaders = []
    forwarded: list[bytes] = []
    for name, value in headers:
        name = name.lower()
        if _dropped(name, _REQUEST_DROPPED, named) or name in _GATEWAY_HEADERS:
            continue
        if name == b"x-forwarded-for":
            forwarded.append(value)
        elif not upstream or name not in _KEY_HEADERS:
            out.append((name, value))
    forwarded.append(peer.encode("latin-1", "replace"))
    out.append((b"x-forwarded-for", b", ".join(forwarded)))
    if upstream and upstream_key is not None:
        out.append((b"authorization", b"Bearer " + upstream_key.encode("latin-1", "replace")))
    if not upstream and token is not None:
        out.append((_GATEWAY_HEADERS[0], token.encode("latin-1", "replace")))
        out.append((_GATEWAY_HEADERS[1], (client or peer).encode("latin-1", "replace")))
    return out


def response_headers(headers: RawHeaders) -> RawHeaders:
    """The worker's response headers minus hop-by-hop ones (content-length stays: bytes pass raw)."""
    named = _connection_tokens(headers)
    return [(k.lower(), v) for k, v in headers if not _dropped(k.lower(), _RESPONSE_DROPPED, named)]


# What an upstream can fail with: refused or unreachable, timed out, broken off, not HTTP.
CONNECT_ERRORS = (httpcore.ConnectError, httpcore.ConnectTimeout)
UPSTREAM_ERRORS = (
    httpcore.NetworkError,
    httpcore.TimeoutException,
    httpcore.ProtocolError,
    httpcore.UnsupportedProtocol,
)
_ONE_WRITE_MAX = 64 * 1024  # a request's bytes held back for one write, at most


class _OneWriteStream(httpcore.AsyncNetworkStream):
    """A connection whose writes wait until the request is whole (httpcore ends each request
    with an empty write) or a read begins, so a request's head and body go out in one send."""

    def __init__(self, stream: httpcore.AsyncNetworkStream):
        self._stream = stream
        self._pending = bytearray()

    async def _flush(self, timeout: float | None) -> None:
        if self._pending:
            data = bytes(self._pending)
            self._pending.clear()
            await self._stream.write(data, timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._pending += buffer
        if not buffer or len(self._pending) >= _ONE_WRITE_MAX:
            await self._flush(timeout)

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        await self._flush(timeout)
        return await self._stream.read(max_bytes, timeout)

    async def aclose(self) -> None:
        self._pending.clear()
        await self._stream.aclose()

    async def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.AsyncNetworkStream:
        await self._flush(timeout)
        return _OneWriteStream(await self._stream.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _OneWriteBackend(httpcore.AsyncNetworkBackend):
    def __init__(self) -> None:
        self._backend = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        return _OneWriteStream(await self._backend.connect_tcp(host, port, timeout, local_address, socket_options))

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None
    ) -> httpcore.AsyncNetworkStream:
        return _OneWriteStream(await self._backend.connect_unix_socket(path, timeout, socket_options))

    async def sleep(self, seconds: float) -> None:
        await self._backend.sleep(seconds)


def new_client() -> httpcore.AsyncConnectionPool:
    """The gateway's one client: httpcore's keep-alive pool to every worker (the layer httpx runs on:
    the client's own layers, URL and header merging, auth and redirect flows, response wrapping, cost
    more per request than the rest of the hop, and the gateway uses none of them)."""
    return httpcore.AsyncConnectionPool(
        ssl_context=httpx.create_ssl_context(trust_env=False),
        max_connections=4096,
        max_keepalive_connections=512,
        keepalive_expiry=30,
        network_backend=_OneWriteBackend(),
    )


class Upstream:
    """A worker's response whose head is in, its body still to read (raw: no decoding)."""

    __slots__ = ("_response", "raw_headers", "status_code", "url")

    def __init__(self, url: str, response: httpcore.Response):
        self.url = url
        self.status_code = response.status
        self.raw_headers: RawHeaders = response.headers
        self._response = response

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (lower case), or None."""
        wanted = name.encode("latin-1")
        for key, value in self.raw_headers:
            if key.lower() == wanted:
                return value.decode("latin-1")
        return None

    def aiter_raw(self) -> AsyncIterator[bytes]:
        return self._response.aiter_stream()

    async def aread(self) -> bytes:
        return b"".join([chunk async for chunk in self._response.aiter_stream()])

    async def aclose(self) -> None:
        # A body not read to its end closes the connection (never back to the pool): the worker sees its client go.
        await self._response.aclose()


async def open_stream(
    client: httpcore.AsyncConnectionPool,
    url: str,
    headers: RawHeaders,
    body: bytes,
    timeout: float,
    method: str = "POST",
) -> Upstream:
    """Send the request; return once the response's head is in (its body still to read).
    Raises ``CONNECT_ERRORS`` or ``UPSTREAM_ERRORS``."""
    parsed = httpcore.URL(url)
    host = parsed.host + (b":%d" % parsed.port if parsed.port else b"")
    request = httpcore.Request(
        method,
        parsed,
        content=body,
        headers=[(b"host", host), (b"content-length", str(len(body)).encode()), *headers],
        extensions={"timeout": {"connect": CONNECT_TIMEOUT_S, "read": timeout, "write": timeout, "pool": timeout}},
    )
    return Upstream(url, await client.handle_async_request(request))


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


async def pump(upstream: Upstream, send: Send) -> bool:
    """Each chunk of ``upstream`` to the client as it arrives, then the end of the body; False if it broke.

    A worker that breaks off mid-body leaves the response unfinished: the client's connection
    is then cut rather than ended cleanly, so it cannot take half an answer for a whole one."""
    try:
        async for chunk in upstream.aiter_raw():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
    except UPSTREAM_ERRORS as exc:
        log_event(logger, "gateway.upstream_broke", logging.WARNING, url=upstream.url, error=type(exc).__name__)
        return False
    await send({"type": "http.response.body", "body": b"", "more_body": False})
    return True


async def close_quietly(upstream: Upstream) -> None:
    with anyio.CancelScope(shield=True):  # even while cancelled: the worker must see the close
        await upstream.aclose()


class RawResponse(Response):
    """A Response that writes itself (``__call__``): FastAPI hands it over untouched."""

    def __init__(self) -> None:
        self.background = None  # FastAPI may attach background tasks: none run here

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:  # pragma: no cover
        raise NotImplementedError


class Relay(RawResponse):
    """An ASGI response relaying one open upstream response, with ``backend`` (the entry that
    answered) in ``x-vllmmlxd-backend``; ``done(status, completed)`` when over."""

    def __init__(self, upstream: Upstream, done: Callable[[int, bool], None], backend: str):
        super().__init__()
        self.upstream = upstream
        self.done = done
        self.backend = backend

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        upstream = self.upstream
        completed = False
        try:
            request_id = upstream.header("x-request-id")
            if request_id:  # the worker's id (chatcmpl-...) is the one its body and logs carry
                scope.setdefault("state", {})["request_id"] = request_id
            await send(
                {
                    "type": "http.response.start",
                    "status": upstream.status_code,
                    "headers": [*response_headers(upstream.raw_headers), (BACKEND_HEADER, self.backend.encode())],
                }
            )
            # Unfinished (client gone, worker broke off): uvicorn cuts the connection.
            completed = await until_disconnect(receive, lambda: pump(upstream, send))
        finally:
            await close_quietly(upstream)
            self.done(upstream.status_code, completed)
