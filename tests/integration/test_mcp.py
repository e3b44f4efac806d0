"""MCP tools on a real worker (`vllmmlxd serve builtin:tiny`) over real MCP servers.

The servers are the SDK-written ones of tests/support/mcp_servers: a stdio child of the
worker and a streamable-HTTP process of the test. The worker starts without MCP and is
given its servers as the daemon gives them: a config parsed from YAML, pushed live.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from tests.support.servers import free_port, start_serve
from vllmmlxd.config.load import parse_config
from vllmmlxd.config.schema import ResolvedModel
from vllmmlxd.supervisor.live import push_settings

SUPPORT = Path(__file__).resolve().parents[1] / "support" / "mcp_servers"
ALICE, CI = "alice-mcp-k3y", "ci-mcp-k3y"
HEADER_SECRET = "s3cret"  # http_server.py's secret_header tool checks for "Bearer s3cret"


@pytest.fixture(scope="module")
def http_server():
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(SUPPORT / "http_server.py"), str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(f"http://127.0.0.1:{port}/mcp", timeout=1)
            break
        except httpx.HTTPError:
            assert time.monotonic() < deadline and proc.poll() is None, "the MCP HTTP server did not start"
            time.sleep(0.1)
    yield f"http://127.0.0.1:{port}/mcp"
    proc.terminate()
    proc.wait(10)


@pytest.fixture(scope="module")
def worker():
    sock = Path(tempfile.mkdtemp(prefix="vllmmlxd-mcp-")) / "w.sock"
    port = free_port()
    s = start_serve(
        "builtin:tiny", "--health-socket", str(sock), port=port, threads=None, env={"MCP_TEST_KEY": HEADER_SECRET}
    )
    yield s, sock, port
    assert s.stop() == 0, s.log()[-3000:]


def entry(
    port: int,
    url: str,
    *,
    keys: bool = False,
    extra_servers: str = "",
    mcp: str = "[files, search, broken]",
    search_timeout: float = 30,
) -> ResolvedModel:
    text = f"""
mcp_servers:
  files: {{command: {sys.executable}, args: ["{SUPPORT / "stdio_server.py"}"], env: {{MCP_TEST_GREETING: hello}},
           deny_tools: [crash]}}
  search: {{transport: streamable-http, url: "{url}", headers: {{Authorization: "Bearer ${{env:MCP_TEST_KEY}}"}},
            timeout: {search_timeout}}}
  broken: {{command: {sys.executable}, args: ["{SUPPORT / "stdio_server.py"}"], env: {{MCP_TEST_REFUSE: "1"}}}}
{extra_servers}
api_keys:
  alice: {{key: {ALICE}}}
  ci: {{key: {CI}, mcp: [search]}}
models:
  m:
    model: builtin:tiny
    port: {port}
    mcp: {mcp}
{"    api_keys: [alice, ci]" if keys else ""}
"""
    os.environ["MCP_TEST_KEY"] = HEADER_SECRET
    entry = parse_config(text).config.models["m"]
    assert isinstance(entry, ResolvedModel)  # served here, not an upstream
    return entry


def apply(sock: Path, config: ResolvedModel) -> None:
    ok, detail = asyncio.run(push_settings(sock, config))
    assert ok and detail == config.config_hash(), detail


def servers(url: str, key: str | None = None) -> dict[str, dict]:
    r = httpx.get(url + "/v1/mcp/servers", headers=_auth(key), timeout=10)
    assert r.status_code == 200, r.text
    return {s["name"]: s for s in r.json()["data"]}


def _auth(key: str | None) -> dict:
    return {"Authorization": f"Bearer {key}"} if key else {}


def execute(url: str, name: str, arguments: dict | None = None, key: str | None = None) -> httpx.Response:
    body = {"name": name} if arguments is None else {"name": name, "arguments": arguments}
    return httpx.post(url + "/v1/mcp/execute", json=body, headers=_auth(key), timeout=30)


def wait_states(url: str, want: dict[str, str], key: str | None = None, timeout: float = 30) -> dict[str, dict]:
    deadline = time.monotonic() + timeout
    while True:
        found = servers(url, key)
        if {n: found.get(n, {}).get("state") for n in want} == want:
            return found
        assert time.monotonic() < deadline, f"servers not {want}: {found}"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def serving(worker, http_server):
    s, sock, port = worker
    apply(sock, entry(port, http_server))
    wait_states(s.url, {"files": "ready", "search": "ready", "broken": "failed"})
    return s


def test_tools_are_listed_namespaced_with_their_schemas(serving):
    tools = {t["name"]: t for t in httpx.get(serving.url + "/v1/mcp/tools", timeout=10).json()["data"]}
    assert set(tools) == {
        "files__echo",
        "files__add",
        "files__whoami",
        "files__traceparent",
        "files__fail",  # crash is denied
        "search__lookup",
        "search__slow",
        "search__secret_header",
    }
    add = tools["files__add"]
    assert (add["server"], add["tool"], add["description"]) == ("files", "add", "Add two integers.")
    assert add["input_schema"]["properties"]["a"]["type"] == "integer"  # as the server gave it
    listed = servers(serving.url)
    assert listed["files"]["tools"] == 5 and listed["search"]["transport"] == "streamable-http"


def test_execute_over_both_transports(serving):
    r = execute(serving.url, "files__add", {"a": 20, "b": 22})
    assert r.status_code == 200 and r.json() == {
        "name": "files__add",
        "content": [{"type": "text", "text": "42"}],
        "is_error": False,
    }
    assert execute(serving.url, "files__whoami", {}).json()["content"][0]["text"].endswith(" hello")  # its env
    r = execute(serving.url, "search__lookup", {"query": "mlx"})
    assert r.json()["content"][0]["text"] == "results for 'mlx' (limit 3)"
    assert execute(serving.url, "search__secret_header", {}).json()["content"][0]["text"] == "yes"  # its headers


def test_errors_tool_failure_unknown_tool_and_bad_arguments(serving):
    r = execute(serving.url, "files__fail", {"reason": "disk full"})
    assert r.status_code == 200 and r.json()["is_error"] is True
    assert "disk full" in r.json()["content"][0]["text"]
    for name in ("files__crash", "files__nope", "nope__add", "add"):
        r = execute(serving.url, name, {})
        assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_tool", name
    r = execute(serving.url, "files__add", {"a": "one", "b": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "arguments"
    assert execute(serving.url, "files__add", {"a": 1}).status_code == 400
    assert httpx.post(serving.url + "/v1/mcp/execute", json={"arguments": {}}, timeout=10).status_code == 422


def test_a_server_that_cannot_start_is_reported_and_the_model_still_serves(serving, worker):
    broken = servers(serving.url)["broken"]
    assert broken["state"] == "failed" and broken["tools"] == 0
    # Its stderr is for operators: an API client gets a generic reason, here and from a call.
    assert broken["last_error"] and "MCP_TEST_REFUSE" not in json.dumps(broken) and "stderr" not in broken
    r = execute(serving.url, "broken__anything", {})
    assert r.status_code == 200 and r.json()["is_error"] and "MCP_TEST_REFUSE" not in r.text
    r = httpx.post(serving.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=60)
    assert r.status_code == 200
    _, sock, _ = worker
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://worker", timeout=10) as c:
        reported = {s["name"]: s for s in c.get("/health").json()["load"]["mcp"]}
    assert reported["broken"]["state"] == "failed" and reported["files"]["tools"] == 5
    assert "MCP_TEST_REFUSE" in reported["broken"]["last_error"]  # the daemon's status: its stderr's last line


def test_a_killed_stdio_server_is_restarted(serving):
    before = int(execute(serving.url, "files__whoami", {}).json()["content"][0]["text"].split()[0])
    connects = servers(serving.url)["files"]["connects"]
    os.kill(before, 9)
    deadline = time.monotonic() + 30
    while not (
        servers(serving.url)["files"]["connects"] > connects and servers(serving.url)["files"]["state"] == "ready"
    ):
        assert time.monotonic() < deadline, servers(serving.url)
        time.sleep(0.1)
    after = int(execute(serving.url, "files__whoami", {}).json()["content"][0]["text"].split()[0])
    assert after != before
    assert servers(serving.url)["files"]["last_error"]  # why it went down is kept


def test_a_key_narrowed_to_a_server_sees_and_runs_only_its_tools(worker, http_server):
    s, sock, port = worker
    apply(sock, entry(port, http_server, keys=True))
    try:
        wait_states(s.url, {"files": "ready", "search": "ready"}, key=ALICE)
        assert set(servers(s.url, CI)) == {"search"}
        names = {t["name"] for t in httpx.get(s.url + "/v1/mcp/tools", headers=_auth(CI), timeout=10).json()["data"]}
        assert names == {"search__lookup", "search__slow", "search__secret_header"}
        r = execute(s.url, "files__add", {"a": 1, "b": 2}, key=CI)
        assert r.status_code == 403 and r.json()["error"]["code"] == "mcp_server_not_allowed"
        assert execute(s.url, "search__lookup", {"query": "q"}, key=CI).status_code == 200
        assert execute(s.url, "files__add", {"a": 1, "b": 2}, key=ALICE).json()["content"][0]["text"] == "3"
        assert execute(s.url, "files__add", {"a": 1, "b": 2}).status_code == 401  # same auth as every /v1 route
        assert httpx.get(s.url + "/v1/mcp/tools", timeout=10).status_code == 401
    finally:
        apply(sock, entry(port, http_server))


def test_the_server_timeout_bounds_an_execution(worker, http_server):
    s, sock, port = worker
    apply(sock, entry(port, http_server, search_timeout=1))
    try:
        wait_states(s.url, {"search": "ready"})
        started = time.monotonic()
        r = execute(s.url, "search__slow", {"seconds": 10})
        assert r.status_code == 200 and r.json()["is_error"] and "1s" in r.json()["content"][0]["text"]
        assert time.monotonic() - started < 5
    finally:
        apply(sock, entry(port, http_server))


def test_executions_are_logged_without_arguments_or_secrets(serving):
    def logged() -> list[str]:
        return [x for x in serving.log().splitlines() if "event=mcp.execute" in x and "tool=echo" in x]

    execute(serving.url, "files__echo", {"text": "PRIVATE-ARGUMENT-VALUE"})
    deadline = time.monotonic() + 30
    while not logged():  # the execution's line, written once it is done
        assert time.monotonic() < deadline, serving.log()[-3000:]
        time.sleep(0.1)
    line, log = logged()[0], serving.log()
    assert "server=files" in line and "duration_ms=" in line and "ok=True" in line
    assert "PRIVATE-ARGUMENT-VALUE" not in log and HEADER_SECRET not in log


def test_serve_imports_a_claude_desktop_file(tmp_path, http_server):
    path = tmp_path / "claude_desktop_config.json"
    path.write_text(f'''{{"mcpServers": {{
        "files": {{"command": "{sys.executable}", "args": ["{SUPPORT / "stdio_server.py"}"], "env": {{"MCP_TEST_GREETING": "desk"}}}},
        "search": {{"url": "{http_server}", "headers": {{"Authorization": "Bearer {HEADER_SECRET}"}}}}}},
      "globalShortcut": "Ctrl+Space"}}''')
    s = start_serve("builtin:tiny", "--mcp-config", str(path))
    try:
        found = wait_states(s.url, {"files": "ready", "search": "ready"})
        assert {n: v["transport"] for n, v in found.items()} == {"files": "stdio", "search": "streamable-http"}
        assert execute(s.url, "files__whoami", {}).json()["content"][0]["text"].endswith(" desk")
        assert execute(s.url, "search__secret_header", {}).json()["content"][0]["text"] == "yes"
    finally:
        assert s.stop() == 0
