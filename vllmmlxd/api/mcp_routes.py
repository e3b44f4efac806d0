"""``/v1/mcp/servers``, ``/v1/mcp/tools`` and ``/v1/mcp/execute``: a worker's MCP tools over HTTP.

Behind the same key check and limits as every /v1 route (the app adds them); a key whose
grant lists MCP servers sees only those, and gets 403 for another server's tool.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request

from ..errors import Forbidden
from ..mcp.hub import McpHub, McpUnknownTool
from ..mcp.scope import allowed_servers
from .body import read_json, validate
from .context import LiveContext, ServingContext


class ExecuteRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(..., description="the tool as SERVER__TOOL")
    arguments: dict[str, Any] = Field(default_factory=dict, description="checked against the tool's input schema")


def _scope(ctx: ServingContext, request: Request) -> tuple[McpHub | None, frozenset[str] | None]:
    return ctx.mcp, allowed_servers(getattr(request.state, "caller", None), ctx.config)


def make_router(live: LiveContext) -> APIRouter:
    router = APIRouter()

    # response_model=None: a dict is sent as built, not validated against the return annotation.
    @router.get("/v1/mcp/servers", response_model=None)
    async def servers(request: Request) -> dict[str, Any]:
        hub, allowed = _scope(live.capture(request), request)
        rows = hub.public_status() if hub is not None else []  # the stderr and its quotes are the operator's
        data = [row for row in rows if allowed is None or row["name"] in allowed]
        return {"object": "list", "data": data}

    @router.get("/v1/mcp/tools", response_model=None)
    async def tools(request: Request) -> dict[str, Any]:
        hub, allowed = _scope(live.capture(request), request)
        found = hub.tools(allowed) if hub is not None else []
        return {
            "object": "list",
            "data": [
                {
                    "name": t.name,
                    "server": t.server,
                    "tool": t.tool,
                    "description": t.description,
                    "input_schema": t.input_schema,
                }
                for t in found
            ],
        }

    @router.post("/v1/mcp/execute", response_model=None)
    async def execute(request: Request) -> dict[str, Any]:
        ctx = live.capture(request)
        hub, allowed = _scope(ctx, request)
        req = validate(ExecuteRequest, await read_json(request, ctx.max_body_bytes))
        server = hub.server_of(req.name) if hub is not None else None
        if hub is None or server is None:
            raise McpUnknownTool(f"no MCP tool {req.name!r} here")
        if allowed is not None and server not in allowed:
            raise Forbidden(f"this key may not use MCP server {server!r}", code="mcp_server_not_allowed")
        result = await hub.call(req.name, req.arguments)
        return {"name": req.name, "content": result.content, "is_error": result.is_error}

    return router
