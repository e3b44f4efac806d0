"""MCP servers through the real daemon: `vllmmlxctl check` names a wrong server with its place,
`status` shows each model's servers, and an edit of one server is pushed live to the workers
that use it (same worker, its MCP client reconnected) and to no other."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import openai
import pytest

from tests.support.daemon import free_port, make_daemon, wait_gone

pytestmark = pytest.mark.timeout(300)
STDIO = Path(__file__).resolve().parents[1] / "support" / "mcp_servers" / "stdio_server.py"
SECRET = "mcp-env-s3cret"


@pytest.fixture
def daemon():
    d = make_daemon()
    yield d
    pids = d.worker_pids()
    d.stop()
    assert wait_gone(pids, 20)


def config(d, ports: tuple[int, ...], greeting: str, a_servers: str = "[files]") -> str:
    runs = "[files__add]" if "files" in a_servers else "[]"
    return f"""
daemon: {{control_socket: "{d.socket}", state_dir: "{d.state_dir}", drain_timeout: 10, watch: false}}
gateway: {{port: {ports[2]}, ui: false}}
mcp_servers:
  files: {{command: "{sys.executable}", args: ["{STDIO}"], env: {{MCP_TEST_GREETING: {greeting}, TOKEN: {SECRET}}}}}
  notes: {{command: "{sys.executable}", args: ["{STDIO}"], env: {{MCP_TEST_GREETING: notes}}}}
models:
  a: {{model: "builtin:tiny", port: {ports[0]}, mcp: {a_servers}, mcp_auto_execute: {runs}}}
  b: {{model: "builtin:tiny", port: {ports[1]}, mcp: [notes]}}
"""


def whoami(port: int, name: str) -> tuple[int, str]:
    r = httpx.post(f"http://127.0.0.1:{port}/v1/mcp/execute", json={"name": name, "arguments": {}}, timeout=30)
    pid, greeting = r.json()["content"][0]["text"].split()
    return int(pid), greeting


def mcp_ready(models: dict, name: str, server: str) -> bool:
    return any(s["name"] == server and s["state"] == "ready" for s in models[name].get("mcp") or [])


def test_an_mcp_server_edit_reconnects_only_the_workers_using_it(daemon):
    ports = (free_port(), free_port(), free_port())
    daemon.write_text(config(daemon, ports, "one"))
    daemon.start()
    daemon.wait_ready({"a", "b"})
    daemon.wait_for(lambda ms: mcp_ready(ms, "a", "files") and mcp_ready(ms, "b", "notes"), 60, "MCP servers ready")
    daemon.wait_for(lambda ms: (daemon.status().get("gateway") or {}).get("state") == "ready", 60, "gateway")
    # Through the gateway by the model's name, the Responses API runs the worker's own tool
    # (auto-executed) and shows it as an mcp_call item with the server's result.
    made = openai.OpenAI(base_url=f"http://127.0.0.1:{ports[2]}/v1", api_key="x", max_retries=0).responses.create(
        model="a",
        input="add",
        tool_choice={"type": "function", "name": "files__add"},
        max_output_tokens=100,
        extra_body={"temperature": 1.0, "seed": 3},
    )
    call = made.output[0]
    assert (call.type, call.server_label, call.name) == ("mcp_call", "files", "add"), made.output
    assert int(call.output) == sum(json.loads(call.arguments).values())
    status = daemon.ctl("status")
    assert "a mcp: files ready (6 tools)" in status.stdout and "b mcp: notes ready (6 tools)" in status.stdout
    workers = {n: m["pid"] for n, m in daemon.models().items()}
    files_pid, greeting = whoami(ports[0], "files__whoami")
    notes_pid, _ = whoami(ports[1], "notes__whoami")
    assert greeting == "one"

    daemon.write_text(config(daemon, ports, "two"))
    plan = daemon.ctl("reload", "--dry-run")
    assert "a: apply live (mcp_servers_resolved)" in plan.stdout and "unchanged: b" in plan.stdout, plan.stdout
    reload = daemon.ctl("reload")
    assert reload.returncode == 0, reload.stdout + reload.stderr
    daemon.wait_for(lambda ms: mcp_ready(ms, "a", "files"), 60, "files reconnected")
    assert {n: m["pid"] for n, m in daemon.models().items()} == workers  # no worker replaced
    new_files_pid, greeting = whoami(ports[0], "files__whoami")
    assert greeting == "two" and new_files_pid != files_pid  # a's client reconnected to a new server
    assert whoami(ports[1], "notes__whoami")[0] == notes_pid  # b's untouched
    assert daemon.log().count("event=worker.spawned") == 3  # a, b and the gateway, once each

    # A model may drop its servers live too: their tools are gone, the child stopped.
    daemon.write_text(config(daemon, ports, "two", a_servers="[]"))
    assert daemon.ctl("reload").returncode == 0
    assert httpx.get(f"http://127.0.0.1:{ports[0]}/v1/mcp/tools", timeout=10).json()["data"] == []
    assert wait_gone([new_files_pid], 10)
    assert {n: m["pid"] for n, m in daemon.models().items()} == workers
    shown = daemon.log() + status.stdout + plan.stdout + daemon.ctl("status", "--json").stdout
    assert SECRET not in shown


def test_check_names_an_unknown_server_with_its_place(tmp_path):
    d = make_daemon()
    d.write_text(config(d, (free_port(), free_port(), free_port()), "one", a_servers="[files, serach]"))
    r = d.ctl("check", str(d.config_path))
    assert r.returncode != 0
    assert f"{d.config_path}:8:3: models.a: model 'a': mcp[1] names an MCP server mcp_servers does not define" in (
        r.stdout + r.stderr
    )
