"""A worker's MCP servers behind one face: their tools, namespaced, and running one.

The routes (``api/mcp_routes.py``) and the server-side tool loop both use ``McpHub``: ``tools`` lists
what the ready servers offer as ``server__tool`` (input schemas as the server gave them),
``call`` checks a call against its tool's schema, runs it under the server's timeout and
logs it without its arguments, ``status`` says how each server is. The hub outlives
settings pushes: ``reconfigure`` restarts only the servers whose definitions changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import cast

from mcp.types import RequestParamsMeta

from ..config.mcp import MCP_TOOL_SEPARATOR, McpServerConfig
from ..errors import InvalidRequest, RequestError
from ..http.tracing import TRACING, inject
from ..log import log_event
from .link import READY, Link

logger = logging.getLogger("vllmmlxd.mcp")


class McpUnknownTool(RequestError):
    """No ready server of this worker offers a tool by that name (404)."""

    status_code = 404
    error_type = "not_found_error"

    def __init__(self, message: str):
        super().__init__(message, param="name", code="unknown_tool")


class McpBadArguments(InvalidRequest):
    """The arguments do not match the tool's input schema (400)."""

    def __init__(self, message: str):
        super().__init__(message, param="arguments", code="invalid_tool_arguments")


@dataclass(frozen=True)
class McpTool:
    name: str  # "server__tool"
    server: str
    tool: str
    description: str
    input_schema: dict


@dataclass(frozen=True)
class McpResult:
    content: list[dict]  # MCP content blocks as dicts ({"type": "text", "text": "..."})
    is_error: bool

    def text(self) -> str:
        """The text blocks joined, for feeding back to a model."""
        return "\n".join(b.get("text", "") for b in self.content if b.get("type") == "text")


def _failed(message: str) -> McpResult:
    return McpResult(content=[{"type": "text", "text": message}], is_error=True)


class McpHub:
    """The MCP servers of one worker; links start with ``start`` (on the worker's event loop)."""

    def __init__(self, servers: dict[str, McpServerConfig] | None = None, model: str = ""):
        self.model = model
        self._links: dict[str, Link] = {n: Link(n, c, model) for n, c in (servers or {}).items()}
        self._running = False
        self._stopping: set[asyncio.Task] = set()  # links a reconfigure stops: held until they end

    @property
    def servers(self) -> tuple[str, ...]:
        return tuple(self._links)

    async def start(self) -> None:
        self._running = True
        for link in self._links.values():
            link.start()

    async def close(self) -> None:
        self._running = False
        await asyncio.gather(*(link.stop() for link in self._links.values()), return_exceptions=True)

    @contextlib.asynccontextmanager
    async def lifespan(self, _app: object = None) -> AsyncIterator[None]:
        """The public app's lifespan: connect when the worker starts serving, stop children at its end."""
        await self.start()
        try:
            yield
        finally:
            await self.close()

    def reconfigure(self, servers: dict[str, McpServerConfig]) -> None:
        """Take new server definitions: changed and removed servers stop, changed and added ones
        start; unchanged ones keep their connection (and their child process)."""
        old = self._links
        keep = {n: link for n, link in old.items() if servers.get(n) == link.config}
        links = {n: keep.get(n) or Link(n, c, self.model) for n, c in servers.items()}
        self._links = links  # one assignment: calls see the old set or the new one
        gone = [link for n, link in old.items() if links.get(n) is not link]
        if not self._running:
            return
        loop = asyncio.get_running_loop()
        for link in gone:
            task = loop.create_task(link.stop())
            self._stopping.add(task)
            task.add_done_callback(self._stopping.discard)
        for n, link in links.items():
            if n not in keep:
                link.start()
        if gone or len(keep) != len(links):
            log_event(
                logger,
                "mcp.reconfigured",
                model=self.model,
                restarted=",".join(sorted(n for n in links if n not in keep)) or None,
                removed=",".join(sorted(set(old) - set(links))) or None,
            )

    def tools(self, servers: frozenset[str] | None = None) -> list[McpTool]:
        """The ready servers' tools; ``servers``: only these (None: all of this worker's)."""
        out = []
        for name, link in list(self._links.items()):
            if link.state != READY or (servers is not None and name not in servers):
                continue
            out += [
                McpTool(
                    name=f"{name}{MCP_TOOL_SEPARATOR}{t.name}",
                    server=name,
                    tool=t.name,
                    description=t.description or "",
                    input_schema=dict(t.input_schema or {}),
                )
                for t in link.tools
            ]
        return out

    def status(self) -> list[dict]:
        """Per server, for operators: name, transport, state, tools (a count), last_error, connects, last stderr lines."""
        return [link.status() for link in list(self._links.values())]

    def public_status(self) -> list[dict]:
        """``status`` as API clients see it: a generic ``last_error``, no stderr."""
        return [link.public_status() for link in list(self._links.values())]

    def server_of(self, name: str) -> str | None:
        """The server part of ``server__tool`` when that server is one of this worker's."""
        server = name.split(MCP_TOOL_SEPARATOR, 1)[0] if MCP_TOOL_SEPARATOR in name else None
        return server if server in self._links else None

    async def call(self, name: str, arguments: dict) -> McpResult:
        """Run tool ``name`` (``server__tool``): 404 when unknown, 400 when the arguments do not fit
        its schema; a tool's own failure, a timeout or a lost server is a result with ``is_error``."""
        server, _, tool_name = name.partition(MCP_TOOL_SEPARATOR)
        link = self._links.get(server) if tool_name else None
        if link is None:
            raise McpUnknownTool(
                f"no MCP tool {name!r} here; tools are named SERVER__TOOL (servers: {', '.join(self._links) or 'none'})"
            )
        if link.state != READY or link.session is None:
            return _failed(
                f"MCP server {server!r} is not available ({link.state}{': ' + link.reason if link.reason else ''})"
            )
        tool = next((t for t in link.tools if t.name == tool_name), None)
        if tool is None:
            raise McpUnknownTool(f"MCP server {server!r} offers no tool {tool_name!r}")
        check_arguments(arguments, dict(tool.input_schema or {}))
        attrs = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name, "vllmmlxd.mcp.server": server}
        with TRACING.span(f"execute_tool {name}", **attrs) as span:
            out = await self._run(link, name, server, tool_name, arguments)
            if out.is_error:
                span.set_attribute("error.type", "tool_error")
        return out

    async def _run(self, link: Link, name: str, server: str, tool_name: str, arguments: dict) -> McpResult:
        """One call of a ready server's tool, timed out and logged; a failure is a result."""
        session, timeout = link.session, link.config.timeout
        assert session is not None  # call() answers a server that is not ready itself
        started = time.perf_counter()
        try:
            # The trace's context rides in the request's _meta (OpenTelemetry's MCP conventions): per
            # call, whatever the transport, where an HTTP header would be the connection's.
            meta = cast(RequestParamsMeta, inject({})) or None
            result = await asyncio.wait_for(session.call_tool(tool_name, arguments, meta=meta), timeout)
            out = McpResult(
                content=[b.model_dump(mode="json", by_alias=True, exclude_none=True) for b in result.content],
                is_error=bool(result.is_error),
            )
        except TimeoutError:
            out = _failed(f"MCP tool {name} did not finish within {timeout:g}s")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if _is_protocol_error(exc):  # the server's own answer to this call: the caller's to read
                out = _failed(f"MCP tool {name} failed: {_first_line(exc)}")
            else:  # the connection broke under the call: reconnect now (why, with its stderr, is the operator's)
                link.lost(exc)
                out = _failed(f"MCP server {server!r} failed during the call: {link.reason}")
                log_event(
                    logger,
                    "mcp.call_broke",
                    logging.WARNING,
                    model=self.model,
                    server=server,
                    tool=tool_name,
                    error=link.last_error,
                )
        log_event(
            logger,
            "mcp.execute",
            model=self.model,
            server=server,
            tool=tool_name,
            duration_ms=round((time.perf_counter() - started) * 1000),
            ok=not out.is_error,
        )
        return out


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:400] if text else type(exc).__name__


def _is_protocol_error(exc: BaseException) -> bool:
    """An error the server answered (bad params, unknown tool): the connection is fine."""
    from mcp.shared.exceptions import MCPError
    from mcp_types.jsonrpc import CONNECTION_CLOSED

    return isinstance(exc, MCPError) and exc.error.code != CONNECTION_CLOSED


def check_arguments(arguments: object, schema: dict) -> None:
    """``McpBadArguments`` unless ``arguments`` is an object valid under ``schema`` (a schema that
    is itself broken is the server's problem: the call goes through and the server judges it)."""
    import jsonschema
    from jsonschema.exceptions import SchemaError

    if not isinstance(arguments, dict):
        raise McpBadArguments("arguments must be a JSON object")
    if not schema:
        return
    try:
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        cls.check_schema(schema)
        error = jsonschema.exceptions.best_match(cls(schema).iter_errors(arguments))
    except SchemaError:
        return
    if error is not None:
        where = "/".join(map(str, error.absolute_path))
        raise McpBadArguments(f"arguments{'/' + where if where else ''}: {error.message}")
