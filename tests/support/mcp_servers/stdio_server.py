"""An MCP server over stdio, as an editor's tool server would be: `python stdio_server.py`.

Its tools let tests see namespacing, schemas, tool errors, which process answered, and a
restart after a crash. ``MCP_TEST_GREETING`` from its env shows the configured env arrives.
"""

from __future__ import annotations

import os
import sys

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("files", log_level="WARNING")


@server.tool()
def echo(text: str) -> str:
    """Return the text as given."""
    return text


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def whoami() -> str:
    """This server's process id and greeting (from its env)."""
    return f"{os.getpid()} {os.environ.get('MCP_TEST_GREETING', '')}"


@server.tool()
def traceparent(ctx: Context) -> str:
    """The trace context the call came with (its _meta), or nothing."""
    meta = ctx.request_context.meta or {}
    return str(meta.get("traceparent", ""))


@server.tool()
def fail(reason: str) -> str:
    """Always fails, with the reason as its error."""
    raise ToolError(f"failed on purpose: {reason}")


@server.tool()
def crash() -> str:
    """Exit the process at once, as a crashing server would."""
    print("crashing on purpose", file=sys.stderr, flush=True)
    os._exit(3)


if __name__ == "__main__":
    if os.environ.get("MCP_TEST_REFUSE"):  # a server that cannot start
        print("cannot start: MCP_TEST_REFUSE is set", file=sys.stderr, flush=True)
        sys.exit(2)
    server.run("stdio")
