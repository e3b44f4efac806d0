"""One MCP server as a worker sees it: connected, watched, reconnected with backoff.

A stdio server is this worker's child: if it exits (or stops answering pings), the link
notices, keeps its last stderr lines for the operator's error, and starts it again after a
growing pause. API clients (and a model calling the tools) are told a generic reason: a
server's stderr may hold anything, the values of its ``env`` included. An HTTP server is reconnected the same way. A server that cannot start never stops
the model serving: its tools are simply absent and the failure is reported in ``status``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from ..config.mcp import McpServerConfig
from ..log import log_event

if TYPE_CHECKING:  # mcp is imported when a server connects, not with the worker
    from mcp import ClientSession
    from mcp.client._transport import TransportStreams

logger = logging.getLogger("vllmmlxd.mcp")

PING_EVERY_S = float(os.environ.get("VLLMMLXD_MCP_PING_S", "2"))  # how soon a dead server is noticed
BACKOFF_FIRST_S, BACKOFF_MAX_S = 0.5, 30.0
STABLE_AFTER_S = 10.0  # connected this long: the next failure starts the backoff from the beginning
STDERR_LINES = 20

STARTING, READY, FAILED, DISABLED, STOPPED = "starting", "ready", "failed", "disabled", "stopped"
FAILED_REASON = "the server failed or closed the connection"  # what clients hear of an error not shown them


class _Tail(asyncio.Protocol):
    """Keeps the last lines a stdio server wrote to stderr."""

    def __init__(self, lines: collections.deque):
        self.lines, self.partial = lines, b""

    def data_received(self, data: bytes) -> None:
        *done, self.partial = (self.partial + data).split(b"\n")
        self.lines.extend(line.decode("utf-8", "replace").rstrip() for line in done if line.strip())
        self.partial = self.partial[-4096:]


class Link:
    """The connection to one server, run by its own task until ``stop``."""

    def __init__(self, name: str, config: McpServerConfig, model: str = ""):
        self.name, self.config, self.model = name, config, model
        self.state = DISABLED if not config.enabled else STARTING
        self.tools: tuple = ()  # the SDK's Tool objects the config lets through
        self.last_error: str | None = None  # for operators (status, logs): may quote the server's stderr
        self.reason: str | None = None  # the same failure as API clients are told it
        self.stderr: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)
        self.connects = 0  # successful connections: a reconnect shows as one more
        self.session: ClientSession | None = None
        self._task: asyncio.Task | None = None
        self._lost = asyncio.Event()

    def start(self) -> None:
        if self.config.enabled and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"mcp:{self.name}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.session, self.tools = None, ()
        self.state = DISABLED if not self.config.enabled else STOPPED

    def lost(self, exc: BaseException) -> None:
        """A call found the connection broken: reconnect now, not at the next ping."""
        self.failed(exc)
        self._lost.set()

    def failed(self, exc: BaseException | str) -> None:
        """Note why the server went (an exception, or a reason that is fit for anyone)."""
        self.reason, self.last_error = (exc, exc) if isinstance(exc, str) else self.describe(exc)

    def status(self) -> dict:
        return {
            "name": self.name,
            "transport": self.config.transport,
            "state": self.state,
            "tools": len(self.tools),
            "last_error": self.last_error,
            "connects": self.connects,
            "stderr": list(self.stderr)[-5:],
        }

    def public_status(self) -> dict:
        """``status`` as an API client sees it: the generic reason, no stderr."""
        return {**{k: v for k, v in self.status().items() if k != "stderr"}, "last_error": self.reason}

    async def _run(self) -> None:
        pause = BACKOFF_FIRST_S
        while True:
            # A retry keeps showing "failed" (and why) until it succeeds.
            self.state = FAILED if self.state == FAILED else STARTING
            connected_at = None
            try:
                async with self._connect() as session:
                    result = await asyncio.wait_for(session.list_tools(), self.config.timeout)
                    self.tools = tuple(t for t in result.tools if self.config.offers(t.name))
                    self.session, self.state = session, READY  # last_error stays: why it last went down
                    self.connects += 1
                    connected_at = time.monotonic()
                    log_event(
                        logger,
                        "mcp.connected",
                        model=self.model,
                        server=self.name,
                        transport=self.config.transport,
                        tools=len(self.tools),
                    )
                    await self._watch(session)
            except asyncio.CancelledError:
                raise
            except BaseException as exc:
                self.failed(exc)
            self.session, self.tools = None, ()
            self.state = FAILED
            if self.last_error is None:
                self.failed("connection closed")
            log_event(
                logger,
                "mcp.failed",
                logging.WARNING,
                model=self.model,
                server=self.name,
                error=self.last_error,
                retry_s=pause,
            )
            if connected_at is not None and time.monotonic() - connected_at > STABLE_AFTER_S:
                pause = BACKOFF_FIRST_S
            await asyncio.sleep(pause)
            pause = min(pause * 2, BACKOFF_MAX_S)

    async def _watch(self, session: ClientSession) -> None:
        """Return once the server is gone: a failed ping, or a call that found it broken."""
        self._lost.clear()
        while True:
            try:
                await asyncio.wait_for(self._lost.wait(), PING_EVERY_S)
                return
            except TimeoutError:
                pass
            try:
                await asyncio.wait_for(session.send_ping(), min(self.config.timeout, 10.0))
            except TimeoutError:
                self.failed("did not answer a ping")
                return
            except Exception as exc:
                self.failed(exc)
                return

    @contextlib.asynccontextmanager
    async def _connect(self) -> AsyncIterator[ClientSession]:
        from mcp import ClientSession

        async with contextlib.AsyncExitStack() as stack:
            streams = await stack.enter_async_context(self._transport(stack))
            session = await stack.enter_async_context(ClientSession(streams[0], streams[1]))
            await asyncio.wait_for(session.initialize(), self.config.timeout)
            yield session

    @contextlib.asynccontextmanager
    async def _transport(self, stack: contextlib.AsyncExitStack) -> AsyncIterator[TransportStreams]:
        c = self.config
        if c.transport == "stdio":
            from mcp.client.stdio import StdioServerParameters, stdio_client

            params = StdioServerParameters(
                command=c.command, args=list(c.args), cwd=c.cwd, env={k: v.get_secret_value() for k, v in c.env.items()}
            )
            read_fd, write_fd = os.pipe()
            errlog = os.fdopen(write_fd, "w")
            try:
                transport, _ = await asyncio.get_running_loop().connect_read_pipe(
                    lambda: _Tail(self.stderr), os.fdopen(read_fd, "rb")
                )
            except BaseException:
                errlog.close()
                os.close(read_fd)
                raise
            stack.callback(transport.close)
            try:
                async with stdio_client(params, errlog=errlog) as streams:
                    errlog.close()  # the child has its copy: EOF comes when it exits
                    yield streams
            finally:
                if not errlog.closed:
                    errlog.close()
            return
        headers = {k: v.get_secret_value() for k, v in c.headers.items()}
        assert c.url is not None  # the config refuses an sse or http server without one
        if c.transport == "sse":
            from mcp.client.sse import sse_client

            async with sse_client(c.url, headers=headers, timeout=c.timeout) as streams:
                yield streams
            return
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        async with (
            create_mcp_http_client(headers=headers) as http,
            streamable_http_client(c.url, http_client=http) as streams,
        ):
            yield streams

    def describe(self, exc: BaseException) -> tuple[str, str]:
        """Short reasons for a failure: (for API clients, for operators). A timeout or the OS's reason
        ("connection refused") is told to both; otherwise clients get a generic reason and operators
        the exception's innermost message. Operators also get the server's last stderr line."""
        while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
            exc = exc.exceptions[0]
        if isinstance(exc, asyncio.TimeoutError):
            public = text = f"no answer within {self.config.timeout:g}s"
        else:
            public, text = FAILED_REASON, str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            cause: BaseException | None = exc
            depth = 0
            while cause is not None and depth < 6:  # the OS's reason says most ("connection refused")
                if isinstance(cause, BaseExceptionGroup) and cause.exceptions:
                    cause = cause.exceptions[0]
                if isinstance(cause, OSError) and cause.strerror:
                    public = text = (os.strerror(cause.errno) if cause.errno else cause.strerror).lower()
                    break
                cause, depth = cause.__cause__ or cause.__context__, depth + 1
        if self.stderr and self.config.transport == "stdio":
            text += f" (stderr: {self.stderr[-1][:200]})"
        return public, text[:400]
