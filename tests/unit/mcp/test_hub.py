"""The hub over a real stdio MCP server: namespacing, schemas, errors, a crash and its restart."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from pathlib import Path

import pytest

from vllmmlxd.config.keys import KeyGrant
from vllmmlxd.config.mcp import McpServerConfig
from vllmmlxd.config.schema import ModelConfig
from vllmmlxd.http.access import Caller
from vllmmlxd.mcp.hub import McpBadArguments, McpHub, McpResult, McpUnknownTool, check_arguments
from vllmmlxd.mcp.scope import allowed_servers

SERVER = str(Path(__file__).resolve().parents[2] / "support" / "mcp_servers" / "stdio_server.py")


def stdio(**extra) -> McpServerConfig:
    return McpServerConfig(command=sys.executable, args=(SERVER,), **extra)


async def until(predicate, timeout: float = 20.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.05)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_tools_calls_and_a_restart(caplog):
    caplog.set_level(logging.INFO, logger="vllmmlxd.mcp")

    async def scenario():
        hub = McpHub(
            {
                "files": stdio(env={"MCP_TEST_GREETING": "hi"}, deny_tools=("echo",)),
                "broken": McpServerConfig(command="/nonexistent/mcp-server"),
            },
            model="m",
        )
        async with hub.lifespan():
            await until(lambda: {s["name"]: s["state"] for s in hub.status()} == {"files": "ready", "broken": "failed"})
            names = [t.name for t in hub.tools()]
            assert names == [
                "files__add",
                "files__whoami",
                "files__traceparent",
                "files__fail",
                "files__crash",
            ]  # echo denied
            add = next(t for t in hub.tools() if t.tool == "add")
            assert add.server == "files" and add.input_schema["required"] == ["a", "b"]
            assert hub.tools(frozenset({"broken"})) == []

            assert (await hub.call("files__add", {"a": 2, "b": 3})) == McpResult([{"type": "text", "text": "5"}], False)
            failed = await hub.call("files__fail", {"reason": "no"})
            assert failed.is_error and "failed on purpose: no" in failed.text()
            with pytest.raises(McpBadArguments):
                await hub.call("files__add", {"a": "two", "b": 3})
            for unknown in ("files__echo", "files__nope", "nope__add", "add"):
                with pytest.raises(McpUnknownTool):
                    await hub.call(unknown, {})
            down = await hub.call("broken__x", {})
            assert down.is_error and "not available" in down.text()
            broken = next(s for s in hub.status() if s["name"] == "broken")
            assert broken["tools"] == 0 and "no such file" in broken["last_error"]

            first = (await hub.call("files__whoami", {})).text()
            assert first.endswith(" hi")
            crashed = await hub.call("files__crash", {})
            assert crashed.is_error
            await until(lambda: hub.status()[0]["connects"] == 2 and hub.status()[0]["state"] == "ready")
            status = hub.status()[0]
            assert "crashing on purpose" in status["last_error"] and "crashing on purpose" in status["stderr"]
            # The server's stderr is the operator's: the caller (and a model in the tool loop) gets a generic reason.
            assert "crashing on purpose" not in crashed.text() and "failed during the call" in crashed.text()
            public = hub.public_status()[0]
            assert "stderr" not in public and public["last_error"] and "crashing" not in public["last_error"]
            second = (await hub.call("files__whoami", {})).text()
            assert second.split()[0] != first.split()[0]  # a new process
            pid = int(second.split()[0])
        await until(lambda: not alive(pid))  # the hub closing stops its child; reaped soon after
        return pid

    pid = asyncio.run(scenario())
    with pytest.raises(ProcessLookupError):  # the hub's close stopped its child
        os.kill(pid, 0)
    lines = [r for r in caplog.records if r.getMessage() == "mcp.execute"]
    assert lines and all(set(r.fields) == {"model", "server", "tool", "duration_ms", "ok"} for r in lines)


def test_reconfigure_restarts_only_changed_servers():
    async def scenario():
        hub = McpHub({"a": stdio(), "b": stdio(env={"MCP_TEST_GREETING": "one"})})
        async with hub.lifespan():
            await until(lambda: all(s["state"] == "ready" for s in hub.status()))
            pid_a = (await hub.call("a__whoami", {})).text().split()[0]
            hub.reconfigure({"a": stdio(), "b": stdio(env={"MCP_TEST_GREETING": "two"})})
            await until(lambda: all(s["state"] == "ready" for s in hub.status()))
            assert (await hub.call("a__whoami", {})).text().split()[0] == pid_a
            assert (await hub.call("b__whoami", {})).text().endswith(" two")
            hub.reconfigure({"a": stdio()})
            assert [s["name"] for s in hub.status()] == ["a"]
            with pytest.raises(McpUnknownTool):
                await hub.call("b__whoami", {})

    asyncio.run(scenario())


def test_arguments_are_checked_against_the_schema():
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
        "additionalProperties": False,
    }
    check_arguments({"n": 1}, schema)
    for bad in ({}, {"n": "1"}, {"n": 1, "x": 2}, [1]):
        with pytest.raises(McpBadArguments):
            check_arguments(bad, schema)
    check_arguments({"anything": 1}, {})
    check_arguments({"n": 1}, {"type": "not-a-type"})  # a broken schema is the server's to judge


def test_text_joins_text_blocks():
    result = McpResult(
        [{"type": "text", "text": "a"}, {"type": "image", "data": "..."}, {"type": "text", "text": "b"}], False
    )
    assert result.text() == "a\nb"


def test_a_key_narrows_the_servers():
    config = ModelConfig(model="builtin:tiny").model_copy(
        update={"mcp_servers_resolved": {"files": stdio(), "web": stdio()}}
    )
    grant = KeyGrant(name="ci", sha256="0" * 64, allowed=True, mcp=("web",))
    assert allowed_servers(Caller("key:ci", grant), config) == frozenset({"web"})
    assert allowed_servers(Caller("key:all", grant.model_copy(update={"mcp": None})), config) is None
    assert allowed_servers(Caller("addr:127.0.0.1"), config) is None
    assert allowed_servers(None, config) is None


def test_a_servers_stderr_reaches_operators_only():
    # A server that cannot start writes to stderr (what it prints may hold its env's secrets).
    async def scenario():
        hub = McpHub({"bad": stdio(env={"MCP_TEST_REFUSE": "sk-env-secret"})}, model="m")
        async with hub.lifespan():
            await until(lambda: hub.status()[0]["state"] == "failed" and hub.status()[0]["stderr"])
            await until(lambda: "MCP_TEST_REFUSE" in (hub.status()[0]["last_error"] or ""))
            called = await hub.call("bad__add", {"a": 1, "b": 2})
            return hub.status()[0], hub.public_status()[0], called

    operator, public, called = asyncio.run(scenario())
    assert "MCP_TEST_REFUSE" in operator["last_error"] and any("MCP_TEST_REFUSE" in x for x in operator["stderr"])
    assert "stderr" not in public and public["state"] == "failed" and public["last_error"]
    assert "MCP_TEST_REFUSE" not in repr(public) and "MCP_TEST_REFUSE" not in called.text()
    assert called.is_error and "not available (failed: " in called.text()
