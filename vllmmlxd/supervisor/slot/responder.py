"""The daemon's stand-in on a model's port while no worker serves it.

The daemon holds each model's listening socket for the slot's life, so connections to a
model that is loading, failed or stopped would sit in the kernel's queue with nobody to
answer. While no worker is ready (and none is about to accept), the slot runs this tiny
responder on the socket: it reads the request head and answers 503 with ``Retry-After`` and
an error body in the OpenAI/Anthropic shape, then closes. The slot stops it before a worker
accepts: the two never serve the socket together.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass

from ...log import log_event

logger = logging.getLogger("vllmmlxd.supervisor")

_HEAD_LIMIT = 64 * 1024
_BODY_LIMIT = 1024 * 1024  # a larger body is not read: the close may then reset the connection
_READ_TIMEOUT_S = 5.0
RETRY_SLACK_S = 2.0  # a retrying client's own delay on top of Retry-After (its request, its clock)
GATEWAY_MARK = b"\r\nx-vllmmlxd-gateway-token:"  # http/access.py's header, sent by the daemon's gateway alone


@dataclass(frozen=True)
class Unavailable:
    """Why nobody serves: ``status`` is loading, failed, stopped or unloaded."""

    status: str
    message: str
    retry_after_s: int


def unavailable(name: str, phase: str, fail_reason: str | None, last_error: str | None) -> Unavailable:
    """What the stand-in answers on a model's port in ``phase`` (its slot's), and why. Pure."""
    if phase == "failed":
        detail = (last_error or "").strip().splitlines()[-1:] or [""]
        reason = "; ".join(x for x in (fail_reason, detail[0][:500]) if x)
        return Unavailable("failed", f"model {name} failed: {reason}", 30)
    if phase == "unloaded":
        return Unavailable(
            "unloaded",
            f"model {name} was not loaded: it is loading now; retry after a few "
            "seconds, or send requests through the gateway, which waits for it",
            5,
        )
    if phase == "stopped":
        return Unavailable("stopped", f"model {name} is stopped", 30)
    return Unavailable("loading", f"model {name} is loading", 5)


def answer(why: Unavailable, path: str) -> bytes:
    """The whole HTTP response for a request to ``path``. Pure."""
    if path.split("?", 1)[0] == "/health":
        body: dict[str, object] = {"status": why.status, "message": why.message}
    else:
        body = {"type": "error", "error": {"message": why.message, "type": "overloaded_error", "code": why.status}}
    data = json.dumps(body).encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(data)}\r\n"
        f"retry-after: {why.retry_after_s}\r\n"
        f"x-vllmmlxd-state: {why.status}\r\n"  # the gateway loads an unloaded lazy model and retries
        "connection: close\r\n\r\n"
    )
    return head.encode() + data


def _request_line(head: bytes) -> tuple[str, int]:
    """The path and content length of a request head (``/``, 0 when unreadable)."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length" and value.strip().isdigit():
            length = int(value.strip())
    return (parts[1] if len(parts) >= 2 else "/"), length


class Responder:
    """Answers 503 on a slot's listening socket until ``stop()``; the socket itself stays open."""

    def __init__(
        self,
        sock: socket.socket,
        why: Callable[[], Unavailable],
        answered: Callable[[Unavailable, bool], None] = lambda why, retries: None,
    ):
        self._sock = sock
        self._why = why
        self._answered = answered  # told of each answer (and whether its client retries): a request loads a lazy model
        self._server: asyncio.AbstractServer | None = None

    @property
    def running(self) -> bool:
        return self._server is not None

    async def start(self) -> None:
        if self._server is not None:
            return
        # A duplicate descriptor: closing the server closes only it, never the slot's socket.
        dup = socket.socket(fileno=os.dup(self._sock.fileno()))
        self._server = await asyncio.start_server(
            self._handle, sock=dup, backlog=2048
        )  # listen() again: keep the backlog

    def stop(self) -> None:
        """Stop accepting now (connections already accepted still get their answer)."""
        server, self._server = self._server, None
        if server is not None:
            server.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _READ_TIMEOUT_S)
            path, length = _request_line(head[:_HEAD_LIMIT])
            if 0 < length <= _BODY_LIMIT:  # read the body, so closing does not reset the connection
                await asyncio.wait_for(reader.readexactly(length), _READ_TIMEOUT_S)
            why = self._why()
            writer.write(answer(why, path))
            await writer.drain()
            # The gateway does not retry after Retry-After: it has the daemon load the model and forwards once.
            self._answered(why, GATEWAY_MARK not in head[:_HEAD_LIMIT].lower())
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(OSError, asyncio.TimeoutError):
                await asyncio.wait_for(writer.wait_closed(), 1.0)


class StandIn:
    """A slot's stand-in: a ``Responder`` on its socket exactly while the slot wants one."""

    def __init__(self, name: str, why: Callable[[], Unavailable], answered: Callable[[Unavailable, bool], None]):
        self._name = name
        self._why = why
        self._answered = answered
        self._responder: Responder | None = None

    @property
    def running(self) -> bool:
        return self._responder is not None

    async def sync(self, sock: socket.socket | None, wanted: bool) -> None:
        if sock is None or not wanted:
            self.stop()
            return
        if self._responder is None:
            self._responder = Responder(sock, self._why, self._answered)
            try:
                await self._responder.start()
            except OSError as exc:
                log_event(logger, "slot.responder_failed", logging.WARNING, model=self._name, error=str(exc))
                self._responder = None

    def stop(self) -> None:
        if self._responder is not None:
            self._responder.stop()
            self._responder = None
