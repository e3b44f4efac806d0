"""The daemon's stand-in on a port no worker serves: its answer, and who it tells."""

from __future__ import annotations

import asyncio
import json

from vllmmlxd.sockets import bind_tcp
from vllmmlxd.supervisor.responder import Responder, Unavailable, answer


def test_the_answer_names_the_state_for_the_gateway_and_says_when_to_retry():
    raw = answer(Unavailable("unloaded", "model b was not loaded: it is loading now", 5), "/v1/chat/completions")
    head, body = raw.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 503") and b"x-vllmmlxd-state: unloaded" in head and b"retry-after: 5" in head
    assert json.loads(body)["error"]["code"] == "unloaded"


def test_each_answer_is_reported_so_a_request_can_load_a_lazy_model():
    async def run() -> list[str]:
        sock = bind_tcp("127.0.0.1", 0)
        told: list[str] = []
        responder = Responder(
            sock, lambda: Unavailable("unloaded", "not loaded", 5), lambda why: told.append(why.status)
        )
        await responder.start()
        reader, writer = await asyncio.open_connection(*sock.getsockname())
        writer.write(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n")
        await writer.drain()
        reply = await reader.read()
        writer.close()
        responder.stop()
        sock.close()
        assert reply.startswith(b"HTTP/1.1 503")
        return told

    assert asyncio.run(run()) == ["unloaded"]
