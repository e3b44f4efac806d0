"""Slow and greedy clients: bounds uvicorn's HTTP/1.1 protocol does not have.

uvicorn waits forever for a request head that arrives a byte at a time, or for a body the
client stopped sending, and h11 checks its header cap only while a head is incomplete (a
large head arriving in one read passes). Each such connection holds a slot of
``max_connections``, so a few slow clients could lock everyone out (slowloris). This module
is the worker's protocol class, h11's with three bounds:

- the request head must be complete within ``header_timeout`` seconds of the connection
  opening (or of the previous response);
- once the head is in, the body must keep coming: ``body_timeout`` seconds, plus one second
  per ``BODY_MIN_RATE`` bytes received (a large upload on a slow link is not cut off, a
  trickle is);
- the head is at most ``config.h11_max_incomplete_event_size`` bytes, however it arrives.

Past a bound the client gets a 408 or 431 (when it sent something and no response has
started) and the connection is closed.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Mapping
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

ENV_HEADER_TIMEOUT = "VLLMMLXD_HEADER_TIMEOUT_S"
ENV_BODY_TIMEOUT = "VLLMMLXD_BODY_TIMEOUT_S"
DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_BODY_TIMEOUT_S = 30.0
MAX_HEAD_BYTES = 64 * 1024
BODY_MIN_RATE = 64 * 1024  # bytes per second that earn one more second for the body
_HEAD_END = re.compile(rb"\n\r?\n")  # where h11 ends a head


def _seconds(environ: Mapping[str, str], name: str, default: float) -> float:
    try:
        value = float(environ.get(name, ""))
    except ValueError:
        return default
    return value if value > 0 else default


def header_timeout_s(environ: Mapping[str, str] = os.environ) -> float:
    """``$VLLMMLXD_HEADER_TIMEOUT_S`` when a positive number, else 10 s."""
    return _seconds(environ, ENV_HEADER_TIMEOUT, DEFAULT_HEADER_TIMEOUT_S)


def body_timeout_s(environ: Mapping[str, str] = os.environ) -> float:
    """``$VLLMMLXD_BODY_TIMEOUT_S`` when a positive number, else 30 s."""
    return _seconds(environ, ENV_BODY_TIMEOUT, DEFAULT_BODY_TIMEOUT_S)


def protocol_class(header_timeout: float, body_timeout: float) -> type[H11Protocol]:
    """The protocol class to pass as ``uvicorn.Config(http=...)``, with these timeouts."""
    return type(
        "BoundedH11Protocol", (BoundedH11Protocol,), {"header_timeout": header_timeout, "body_timeout": body_timeout}
    )


def _plain_response(status: int, reason: str, message: str) -> bytes:
    body = message.encode()
    return (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: text/plain; charset=utf-8\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode() + body


class BoundedH11Protocol(H11Protocol):
    header_timeout = DEFAULT_HEADER_TIMEOUT_S
    body_timeout = DEFAULT_BODY_TIMEOUT_S

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # uvicorn's own arguments, passed on
        super().__init__(*args, **kwargs)
        self.max_head = self.config.h11_max_incomplete_event_size or MAX_HEAD_BYTES
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._body_deadline = 0.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # a Transport, as H11Protocol narrows it
        super().connection_made(transport)
        self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state in (h11.IDLE, h11.DONE) and self._head_too_large(data):
            self._refuse(431, "Request Header Fields Too Large", f"the request head is over {self.max_head} bytes")
            return
        if self._body_timer is not None:
            self._body_deadline += len(data) / BODY_MIN_RATE
        super().data_received(data)
        self._watch()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch()  # the next request's head is now awaited

    def _head_too_large(self, data: bytes) -> bool:
        # What h11 holds plus this read: the head of the next request and maybe more after it.
        pending = self.conn.trailing_data[0] + data
        if len(pending) <= self.max_head:
            return False
        return _HEAD_END.search(pending, 0, self.max_head) is None

    def _watch(self) -> None:
        """Arm the timer the connection's state calls for: head awaited, body awaited, or none."""
        if self.transport is None or self.transport.is_closing():
            self._cancel_timers()
            return
        state = self.conn.their_state
        if state is h11.IDLE:
            if self._head_timer is None:
                self._head_timer = self.loop.call_later(self.header_timeout, self._head_timed_out)
        elif self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        if state is h11.SEND_BODY:
            if self._body_timer is None:
                self._body_deadline = self.loop.time() + self.body_timeout
                self._body_timer = self.loop.call_at(self._body_deadline, self._body_timed_out)
        elif self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _cancel_timers(self) -> None:
        for timer in (self._head_timer, self._body_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._body_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.conn.their_state is not h11.IDLE:
            return
        if self.conn.trailing_data[0].strip():  # a head was begun: say why it ends
            self._refuse(408, "Request Timeout", f"the request head did not arrive within {self.header_timeout:g} s")
        else:  # an idle connection: nothing to answer
            self.transport.close()

    def _body_timed_out(self) -> None:
        self._body_timer = None
        if self.conn.their_state is not h11.SEND_BODY:
            return
        if self.flow.read_paused:  # the app has not read what came: not the client's fault, the clock restarts
            self._body_deadline = self.loop.time() + self.body_timeout
        if self.loop.time() < self._body_deadline:  # time earned by what arrived
            self._body_timer = self.loop.call_at(self._body_deadline, self._body_timed_out)
            return
        self._refuse(408, "Request Timeout", f"the request body stopped arriving (over {self.body_timeout:g} s)")

    def _refuse(self, status: int, reason: str, message: str) -> None:
        """Answer ``status`` unless a response to the current request has begun, then close."""
        self._cancel_timers()
        cycle = self.cycle
        current = cycle is not None and self.conn.their_state is not h11.IDLE  # else: the previous request's
        if cycle is not None and not cycle.response_complete:
            # The app is mid-request: it sees a disconnect, and its own response goes nowhere.
            cycle.disconnected = True
            cycle.message_event.set()
        if not (current and cycle.response_started):
            self.transport.write(_plain_response(status, reason, message))
        self.logger.warning("Closing a slow connection: %s", message)
        self.transport.close()
