"""The two uvicorn servers of http/serving.py, in a module of their own so that serving imports
uvicorn only when it makes them (as it always has), and mypy still sees their classes."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Iterator
from types import FrameType

import uvicorn


class PrivateServer(uvicorn.Server):
    """uvicorn for the daemon's socket, leaving signals to the public server."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:  # uvicorn >= 0.29
        yield

    def install_signal_handlers(self) -> None:  # older uvicorn
        pass


class DrainingServer(uvicorn.Server):
    """uvicorn, draining without racing keep-alive clients, and exiting 0 after a drain."""

    draining = False

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        # uvicorn re-raises the signal after its graceful shutdown; a drained process exits 0.
        getattr(self, "_captured_signals", []).clear()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # Stop accepting, then let open connections end on their own (responses now say
        # Connection: close, idle ones time out) before uvicorn closes what is left.
        for server in self.servers:
            server.close()
        self.draining = True
        deadline = time.monotonic() + self.config.timeout_keep_alive + 1
        while self.server_state.connections and time.monotonic() < deadline and not self.force_exit:
            await asyncio.sleep(0.05)
        await super().shutdown(sockets)
