"""Every Responses body and stream event a test receives from a real server, checked against the
specification's required fields (``responses_spec``), whichever client made the request: the
official SDK, httpx, the Agents SDK (all on httpx). ``install`` wraps httpx's transports once per
test process; what departs from the spec is kept in ``PROBLEMS``, which the suite's conftest
turns into the test's failure."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx

from .responses_spec import check_event, check_response

PROBLEMS: list[str] = []
CHECKED = [0]  # bodies and events checked in this process (a test can see that the watch ran)
# POST /v1/responses and GET /v1/responses/{id}: bodies that are response objects.
WATCHED = re.compile(r"/v1/responses(/resp_[^/]+)?$")


class _Reader:
    """What one response's bytes say, fed as they arrive: SSE events checked one by one, a JSON body at the end."""

    def __init__(self, request: httpx.Request, response: httpx.Response):
        self.what = f"{request.method} {request.url.path}"
        self.sse = response.headers.get("content-type", "").startswith("text/event-stream")
        self.buffer = b""

    def feed(self, chunk: bytes) -> None:
        self.buffer += chunk
        if not self.sse:
            return
        while b"\n\n" in self.buffer:
            block, self.buffer = self.buffer.split(b"\n\n", 1)
            self._event(block.decode())

    def _event(self, block: str) -> None:
        data = "\n".join(line[6:] for line in block.splitlines() if line.startswith("data: "))
        if not data or data == "[DONE]":
            return
        try:
            event = json.loads(data)
        except ValueError:
            PROBLEMS.append(f"{self.what}: an event that is not JSON: {data[:80]!r}")
            return
        CHECKED[0] += 1
        PROBLEMS.extend(f"{self.what}: {p}" for p in check_event(event))

    def close(self) -> None:
        if self.sse or not self.buffer:
            return
        try:
            body: Any = json.loads(self.buffer)
        except ValueError:
            return
        CHECKED[0] += 1
        PROBLEMS.extend(f"{self.what}: {p}" for p in check_response(body))


class _Watched(httpx.SyncByteStream):
    def __init__(self, inner: Any, reader: _Reader):
        self.inner, self.reader = inner, reader

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.inner:
            self.reader.feed(chunk)
            yield chunk
        self.reader.close()

    def close(self) -> None:
        self.inner.close()


class _AsyncWatched(httpx.AsyncByteStream):
    def __init__(self, inner: Any, reader: _Reader):
        self.inner, self.reader = inner, reader

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.inner:
            self.reader.feed(chunk)
            yield chunk
        self.reader.close()

    async def aclose(self) -> None:
        await self.inner.aclose()


def _watched(request: httpx.Request, response: httpx.Response) -> bool:
    return response.status_code == 200 and bool(WATCHED.search(request.url.path))


def install() -> None:
    """Wrap httpx's transports (once): each watched response's stream passes through a reader."""
    if getattr(httpx.HTTPTransport, "_spec_watched", False):
        return
    sync, async_ = httpx.HTTPTransport.handle_request, httpx.AsyncHTTPTransport.handle_async_request

    def handle_request(self: httpx.HTTPTransport, request: httpx.Request) -> httpx.Response:
        response = sync(self, request)
        if _watched(request, response):
            response.stream = _Watched(response.stream, _Reader(request, response))
        return response

    async def handle_async_request(self: httpx.AsyncHTTPTransport, request: httpx.Request) -> httpx.Response:
        response = await async_(self, request)
        if _watched(request, response):
            response.stream = _AsyncWatched(response.stream, _Reader(request, response))
        return response

    httpx.HTTPTransport.handle_request = handle_request  # type: ignore[method-assign]
    httpx.AsyncHTTPTransport.handle_async_request = handle_async_request  # type: ignore[method-assign]
    httpx.HTTPTransport._spec_watched = True  # type: ignore[attr-defined]
