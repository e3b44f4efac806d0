"""A bare server name in mcp_auto_execute, through a real worker (builtin:tiny) and a real stdio MCP
server: every tool of that server is run by the worker itself, as `files__*` would be."""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import httpx
import openai

from tests.support.servers import free_port, start_serve
from vllmmlxd.config.schema import ResolvedModel
from vllmmlxd.supervisor.live import push_settings

MODEL = "builtin:tiny"
SERVER = Path(__file__).parents[1] / "support" / "mcp_servers" / "stdio_server.py"
SAMPLING = {"temperature": 1.0, "seed": 7}  # as in test_mcp_loop.py: this model writes a whole call under it


def test_a_bare_server_name_runs_each_of_its_tools():
    folder = Path(tempfile.mkdtemp(prefix="vllmmlxd-bare-"))
    mcp_file = folder / "mcp.json"
    mcp_file.write_text(json.dumps({"mcpServers": {"files": {"command": sys.executable, "args": [str(SERVER)]}}}))
    sock, port = folder / "w.sock", free_port()
    s = start_serve(
        MODEL, "--mcp-config", str(mcp_file), "--health-socket", str(sock), "--timeout", "120", port=port, threads=None
    )
    try:
        config = ResolvedModel(
            model=MODEL,
            served_model_name=MODEL,
            port=port,
            timeout=120,
            mcp_config=str(mcp_file),
            mcp_auto_execute=("files",),
            mcp_max_tool_calls=1,
        )
        assert config.mcp_auto_execute == ("files__*",)
        ok, detail = asyncio.run(push_settings(sock, config))
        assert ok and detail == config.config_hash(), detail
        deadline = time.monotonic() + 60
        while "files__add" not in [t["name"] for t in httpx.get(s.url + "/v1/mcp/tools").json()["data"]]:
            assert time.monotonic() < deadline, s.log()[-3000:]
            time.sleep(0.2)
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=120)
        for tool in ("files__add", "files__fail"):
            r = client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "add"}],
                max_tokens=100,
                extra_body=SAMPLING,
                tool_choice={"type": "function", "function": {"name": tool}},
            )
            message = r.choices[0].message
            # The worker ran it (the client got no tool_calls): the bare name covered this tool.
            assert message.tool_calls is None and [c["function"]["name"] for c in message.model_extra["mcp_calls"]] == [
                tool
            ]
    finally:
        assert s.stop() == 0, s.log()[-3000:]
