"""How a worker and the gateway serve: the same uvicorn set-up for both processes.

A public server on the listening socket (the daemon's, inherited, or bound by hand) that
drains without racing keep-alive clients and exits 0 after a drain; beside it, a private
server on the daemon's Unix socket, answering only once the public one is up (the daemon
takes a health answer as "ready") and quiet about its routine start and stop. The daemon's
end of stdin is the lifeline: EOF means the daemon is gone, so the process drains and exits.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import signal
import socket
import threading
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from ..log import log_event
from .drain import CloseWhenDraining

if TYPE_CHECKING:
    import uvicorn
    from starlette.applications import Starlette

T = TypeVar("T")

ORPHAN_GRACE_S = 15.0  # after the daemon's pipe closes: drain, then exit for sure


def read_line(fd: int) -> bytes:
    """One line from ``fd``, unbuffered, so nothing after it is swallowed."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 1)
        if not chunk:
            break
        data += chunk
    return data


def watch_parent(fd: int, logger: logging.Logger, event: str) -> None:
    """Block until the daemon's end of stdin closes, then stop (gracefully, then for sure)."""
    try:  # os.read, not sys.stdin: a buffered reader's lock breaks interpreter shutdown
        while os.read(fd, 4096):
            pass
    except OSError:
        pass
    log_event(logger, event, logging.WARNING, reason="daemon pipe closed")
    os.kill(os.getpid(), signal.SIGTERM)
    timer = threading.Timer(ORPHAN_GRACE_S, lambda: os._exit(1))
    timer.daemon = True  # a drained process exits 0 without waiting for it
    timer.start()


def start_lifeline(fd: int, logger: logging.Logger, event: str) -> None:
    threading.Thread(target=watch_parent, args=(fd, logger, event), daemon=True).start()


def client_bounds(max_connections: int) -> dict[str, Any]:
    """uvicorn settings that bound slow and greedy clients; the timeouts' env is read here, once."""
    from .slow_clients import MAX_HEAD_BYTES, body_timeout_s, header_timeout_s, protocol_class

    return {
        # h11 always (not httptools when installed): the head cap and timeouts are built on it.
        "http": protocol_class(header_timeout_s(), body_timeout_s()),
        "h11_max_incomplete_event_size": MAX_HEAD_BYTES,
        # uvicorn refuses once open connections reach the limit, the asking one included.
        "limit_concurrency": max_connections + 1,
        "proxy_headers": False,  # the client address is the socket's; trusted proxies are the app's call
    }


def make_servers(
    app: Starlette, private_app: Starlette | None, *, drain_timeout: float, log_level: str, max_connections: int
) -> tuple[uvicorn.Server, uvicorn.Server | None]:
    """The public server for ``app`` (draining; ``app`` answers Connection: close meanwhile) and the
    private one for ``private_app`` (None without a private socket)."""
    import uvicorn

    from .uvicorn_servers import DrainingServer, PrivateServer

    server = DrainingServer(
        uvicorn.Config(
            app,
            log_config=None,
            access_log=False,
            # uvicorn types it int but hands it to asyncio.wait_for, which takes a float.
            timeout_graceful_shutdown=drain_timeout,  # type: ignore[arg-type]
            timeout_keep_alive=5,
            log_level=log_level,
            **client_bounds(max_connections),
        )
    )
    app.add_middleware(CloseWhenDraining, draining=lambda: server.draining)
    private = None
    if private_app is not None:
        logging.getLogger("uvicorn.error").addFilter(_not_private_routine)
        private = PrivateServer(
            uvicorn.Config(
                private_app,
                lifespan="off",
                log_config=None,
                access_log=False,
                timeout_graceful_shutdown=2,
                log_level=log_level,
            )
        )
    return server, private


async def serve_both(
    server: uvicorn.Server,
    listen: socket.socket | list[socket.socket],
    private: uvicorn.Server | None,
    private_socket: socket.socket | None,
) -> None:
    """The public server until it stops (on ``listen``: one socket, or several: the gateway's Ollama
    listener beside its own); the private one beside it, answering only once the public one is up
    and stopping after it."""
    public = asyncio.create_task(server.serve(sockets=listen if isinstance(listen, list) else [listen]))
    if private is None:
        await public
        return
    assert private_socket is not None, "a private server is made only for a private socket"
    while not server.started and not public.done():
        await asyncio.sleep(0.02)
    inner = asyncio.create_task(_quietly(private.serve(sockets=[private_socket])))
    try:
        await public
    finally:
        private.should_exit = True
        await asyncio.gather(inner, return_exceptions=True)


# Set inside the private server's task: its start and stop lines would repeat the public
# server's ("Started server process"), so they are dropped; its warnings are kept.
_PRIVATE = contextvars.ContextVar("vllmmlxd_private_server", default=False)


async def _quietly(coro: Coroutine[Any, Any, T]) -> T:
    _PRIVATE.set(True)  # a task runs in its own copy of the context: only this server is quiet
    return await coro


def _not_private_routine(record: logging.LogRecord) -> bool:
    return not (_PRIVATE.get() and record.levelno < logging.WARNING)
