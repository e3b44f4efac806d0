"""MCP servers in `vllmmlxctl status`: the wire field (optional both ways) and the line under the table."""

from __future__ import annotations

from vllmmlxd.control.mapping import status_response
from vllmmlxd.control.protocol import DaemonStatus, ModelStatus, StatusResponse
from vllmmlxd.ctl.render import render_status

SERVERS = [
    {
        "name": "files",
        "transport": "stdio",
        "state": "ready",
        "tools": 3,
        "last_error": None,
        "connects": 1,
        "stderr": [],
    },
    {
        "name": "search",
        "transport": "streamable-http",
        "state": "failed",
        "tools": 0,
        "last_error": "connection refused",
        "connects": 0,
        "stderr": [],
    },
    {
        "name": "edit",
        "transport": "stdio",
        "state": "ready",
        "tools": 1,
        "last_error": "Connection closed",
        "connects": 3,
    },
    {"name": "legacy", "transport": "sse", "state": "disabled", "tools": 0, "last_error": None, "connects": 0},
]


def status(**extra) -> StatusResponse:
    return StatusResponse(
        daemon=DaemonStatus(pid=1, uptime_s=1, config_path="/c.yaml", config_hash="abc", last_reload=None, version="0"),
        models=[
            ModelStatus(name="llama", state="ready", host="127.0.0.1", port=8001, served_model_name="llama", **extra),
            ModelStatus(name="plain", state="ready", host="127.0.0.1", port=8002, served_model_name="plain"),
        ],
    )


def test_each_models_servers_get_one_line():
    text = render_status(status(mcp=SERVERS), now=0)
    assert (
        "llama mcp: files ready (3 tools), search failed: connection refused, "
        "edit ready (1 tool; restarted 2x, last: Connection closed), legacy disabled"
    ) in text.splitlines()
    assert "plain mcp" not in text
    assert "mcp:" not in render_status(status(), now=0)


def test_the_field_is_optional_both_ways():
    # An older daemon sends no mcp; an older vllmmlxctl keeps a newer one's extra keys.
    assert status().models[0].mcp is None
    data = status(mcp=SERVERS).model_dump(mode="json")
    assert data["models"][0]["mcp"][1]["last_error"] == "connection refused"
    assert data["models"][0]["mcp"][0]["stderr"] == []


def test_the_supervisors_view_maps_the_workers_report():
    from types import SimpleNamespace

    view = SimpleNamespace(
        daemon=SimpleNamespace(pid=1, uptime_s=1, config_path="/c", config_hash="x", last_reload=None, version="0"),
        models=[
            SimpleNamespace(
                name="llama",
                state="ready",
                pid=5,
                host="h",
                port=1,
                restarts=0,
                uptime_s=1.0,
                last_exit_code=None,
                served_model_name="llama",
                last_error=None,
                keys=None,
                runtime={"mcp": SERVERS[:1], "running": 0},
            )
        ],
    )
    assert status_response(view).models[0].mcp[0].tools == 3
