"""An MCP server over streamable HTTP: `python http_server.py PORT [NAME]`.

One process serves one tool set at http://127.0.0.1:PORT/mcp; ``slow`` lets tests see the
per-server timeout, ``secret_header`` that configured headers arrive.
"""

from __future__ import annotations

import asyncio
import sys

from mcp.server.mcpserver import Context, MCPServer

server = MCPServer(sys.argv[2] if len(sys.argv) > 2 else "search", log_level="WARNING")


@server.tool()
def lookup(query: str, limit: int = 3) -> str:
    """Pretend to search: the query and the limit, echoed."""
    return f"results for {query!r} (limit {limit})"


@server.tool()
async def slow(seconds: float) -> str:
    """Sleep, then answer."""
    await asyncio.sleep(seconds)
    return "done"


@server.tool()
def secret_header(ctx: Context) -> str:
    """Whether the request carried the Authorization header tests configure."""
    request = ctx.request_context.request
    return "yes" if request is not None and request.headers.get("authorization") == "Bearer s3cret" else "no"


if __name__ == "__main__":
    server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[1]))
