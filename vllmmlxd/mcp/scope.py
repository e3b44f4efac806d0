"""Which MCP servers a caller may use: the key's ``mcp`` list, else all of the entry's.

Kept apart from the hub so the routes and the server-side tool loop apply one rule.
"""

from __future__ import annotations

from ..config.schema import ResolvedModel
from ..http.access import Caller


def allowed_servers(caller: Caller | None, config: ResolvedModel) -> frozenset[str] | None:
    """The servers ``caller`` may use on this entry; None: every one (an open model, the entry's
    own ``api_key``, or a named key without an ``mcp`` list)."""
    grant = caller.key if caller is not None else None
    if grant is None or grant.mcp is None:
        return None
    return frozenset(grant.mcp) & frozenset(config.mcp_servers_resolved)
