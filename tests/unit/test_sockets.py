"""Listening sockets: what a connection accepted on one gets."""

from __future__ import annotations

import asyncio
import socket

from vllmmlxd.sockets import bind_tcp


def test_connections_accepted_on_a_bound_socket_send_small_writes_at_once():
    # asyncio turns Nagle off (TCP_NODELAY) only on sockets that say they are TCP: without it a
    # streamed answer's small writes wait on the client's delayed ACKs.
    async def run() -> int:
        sock = bind_tcp("127.0.0.1", 0)
        flags: list[int] = []

        async def handle(reader, writer):
            flags.append(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(handle, sock=sock)
        reader, writer = await asyncio.open_connection(*sock.getsockname()[:2])
        await reader.read()
        writer.close()
        server.close()
        await server.wait_closed()
        return flags[0]

    assert asyncio.run(run()) != 0
