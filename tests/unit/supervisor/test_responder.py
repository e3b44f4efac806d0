"""The daemon's stand-in on a port no worker serves: its answer, and who it tells."""

from __future__ import annotations

import asyncio
import json

from vllmmlxd.sockets import bind_tcp
from vllmmlxd.supervisor.slot.responder import Responder, Unavailable, answer


def test_the_answer_names_the_state_for_the_gateway_and_says_when_to_retry():
    raw = answer(Unavailable("unloaded", "model b was not loaded: it is loading now", 5), "/v1/chat/completions")
    head, body = raw.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 503") and b"x-vllmmlxd-state: unloaded" in head and b"retry-after: 5" in head
    assert json.loads(body)["error"]["code"] == "unloaded"


def test_each_answer_is_reported_so_a_request_can_load_a_lazy_model():
    async def run() -> list[tuple[str, bool]]:
        sock = bind_tcp("127.0.0.1", 0)
        told: list[tuple[str, bool]] = []
        responder = Responder(
            sock,
            lambda: Unavailable("unloaded", "not loaded", 5),
            lambda why, retries: told.append((why.status, retries)),
        )
        await responder.start()
        for extra in (b"", b"X-Vllmmlxd-Gateway-Token: t\r\n"):
            reader, writer = await asyncio.open_connection(*sock.getsockname())
            writer.write(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n" + extra + b"\r\n")
            await writer.drain()
            reply = await reader.read()
            writer.close()
            assert reply.startswith(b"HTTP/1.1 503")
        responder.stop()
        sock.close()
        return told

    # A client retries after Retry-After; the gateway (its token header) loads the model and forwards once.
    assert asyncio.run(run()) == [("unloaded", True), ("unloaded", False)]


def test_the_gateway_mark_is_the_header_the_gateway_sends():
    from vllmmlxd.http.access import GATEWAY_TOKEN_HEADER
    from vllmmlxd.supervisor.slot.responder import GATEWAY_MARK

    assert b"\r\n" + GATEWAY_TOKEN_HEADER.encode() + b":" == GATEWAY_MARK
