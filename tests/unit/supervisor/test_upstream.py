"""An upstream entry's health checks against real (tiny) HTTP servers: ready, unreachable, slow."""

from __future__ import annotations

import asyncio

from vllmmlxd.config.schema import ResolvedUpstream
from vllmmlxd.supervisor import upstream as upstream_module
from vllmmlxd.supervisor.upstream import READY, UNREACHABLE, UpstreamChecks


async def _server(delay: float = 0.0, status: int = 200):
    seen: list[bytes] = []

    async def handle(reader, writer):
        head = await reader.readuntil(b"\r\n\r\n")
        seen.append(head)
        await asyncio.sleep(delay)
        writer.write(f"HTTP/1.1 {status} X\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{{}}".encode())
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], seen


def test_ready_then_unreachable_when_the_host_goes_and_its_key_is_sent(monkeypatch):
    async def run():
        server, port, seen = await _server()
        entry = ResolvedUpstream(upstream=f"http://127.0.0.1:{port}", upstream_api_key="sk-up")
        slot = UpstreamChecks("far", entry, interval_s=60, on_change=lambda: None)
        await slot.close()  # its own loop stopped: the checks here are the test's
        assert await slot.check() == (READY, None)
        assert b"authorization: Bearer sk-up" in seen[0]
        server.close()
        await server.wait_closed()
        state, why = await slot.check()
        await slot.close()
        return state, why

    state, why = asyncio.run(run())
    assert state == UNREACHABLE and why.startswith("cannot reach http://127.0.0.1:")


def test_one_slow_answer_is_not_a_fault_two_are(monkeypatch):
    monkeypatch.setattr(upstream_module, "CHECK_TIMEOUT_S", 0.2)

    async def run():
        server, port, _ = await _server(delay=0.5)
        slot = UpstreamChecks(
            "far", ResolvedUpstream(upstream=f"http://127.0.0.1:{port}"), interval_s=60, on_change=lambda: None
        )
        await slot.close()  # its own loop stopped: the checks here are the test's
        slot.state = READY
        first = await slot.check()
        second = await slot.check()
        await slot.close()
        server.close()
        return first, second

    first, second = asyncio.run(run())
    assert first == (READY, None)
    assert second[0] == UNREACHABLE and "did not answer within 0.2s" in second[1]


def test_an_error_answer_is_unreachable_with_its_status():
    async def run():
        server, port, _ = await _server(status=503)
        slot = UpstreamChecks(
            "far", ResolvedUpstream(upstream=f"http://127.0.0.1:{port}"), interval_s=60, on_change=lambda: None
        )
        await slot.close()  # its own loop stopped: the checks here are the test's
        state, why = await slot.check()
        await slot.close()
        server.close()
        return state, why, port

    state, why, port = asyncio.run(run())
    assert (state, why) == (UNREACHABLE, f"http://127.0.0.1:{port}/health answered 503")
