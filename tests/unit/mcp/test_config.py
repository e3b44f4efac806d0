"""The MCP parts of the config: servers, references, key scopes, the mcpServers import, secrets."""

from __future__ import annotations

import json

import pytest

from vllmmlxd.config.diff import LIVE_FIELDS, changed_fields, classify
from vllmmlxd.config.load import parse_config
from vllmmlxd.config.mcp import load_mcp_file
from vllmmlxd.config.schema import INTERNAL_FIELDS, ResolvedModel
from vllmmlxd.errors import ConfigError

BASE = """
mcp_servers:
  files: {transport: stdio, command: python, args: ["-m", "srv"], env: {TOKEN: "${env:MCP_T}"}, timeout: 30}
  search: {transport: streamable-http, url: "http://127.0.0.1:9100/mcp", headers: {Authorization: "Bearer ${env:MCP_T}"}}
  legacy: {transport: sse, url: "http://127.0.0.1:9200/sse", enabled: false}
api_keys:
  ci: {key: "k-ci", models: [llama], mcp: [search]}
models:
  llama:
    model: builtin:tiny
    mcp: [files, search]
    mcp_auto_execute: [files__*]
    api_keys: [ci]
  plain: {model: builtin:tiny, port: 8001}
"""


@pytest.fixture(autouse=True)
def token(monkeypatch):
    monkeypatch.setenv("MCP_T", "t0ps3cret")


def error_of(text: str, path: str = "c.yaml") -> str:
    with pytest.raises(ConfigError) as e:
        parse_config(text, path)
    return str(e.value)


def test_each_entry_carries_only_its_servers_and_keys_their_scope():
    config = parse_config(BASE).config
    llama = config.models["llama"]
    assert set(llama.mcp_servers_resolved) == {"files", "search"}
    assert llama.mcp_servers_resolved["search"].headers["Authorization"].get_secret_value() == "Bearer t0ps3cret"
    assert llama.mcp_servers_resolved["files"].env["TOKEN"].get_secret_value() == "t0ps3cret"
    assert [g.mcp for g in llama.key_grants] == [("search",)]
    assert config.models["plain"].mcp_servers_resolved == {}
    assert llama.mcp_max_tool_calls == 8 and llama.mcp_auto_execute == ("files__*",)


def test_secrets_of_servers_are_never_printed_but_reach_the_worker():
    llama = parse_config(BASE).config.models["llama"]
    assert "t0ps3cret" not in repr(llama) and "t0ps3cret" not in llama.model_dump_json()
    sent = llama.to_worker_json()
    assert "t0ps3cret" in sent
    again = ResolvedModel.model_validate(json.loads(sent))  # what the worker reads from stdin
    assert again == llama and again.config_hash() == llama.config_hash()


def test_an_unknown_server_is_an_error_at_its_place():
    text = BASE.replace("mcp: [files, search]", "mcp: [files, serch]")
    assert error_of(text) == (
        "c.yaml:9:3: models.llama: model 'llama': mcp[1] names an MCP server mcp_servers "
        "does not define; defined: files, legacy, search"
    )
    text = BASE.replace("mcp: [search]}", "mcp: [nope]}")
    assert error_of(text).startswith("c.yaml:7:3: api_keys.ci: key 'ci': mcp[0] names an MCP server")
    text = BASE.replace("mcp_auto_execute: [files__*]", "mcp_auto_execute: [legacy__x]")
    assert "mcp_auto_execute[0] names an MCP server the model does not use; it uses: files, search" in error_of(text)
    text = BASE.replace("mcp_auto_execute: [files__*]", "mcp_auto_execute: [read_file]")
    # A bare name is a server's (all its tools): read_file is none of this model's servers.
    assert "mcp_auto_execute[0] names an MCP server the model does not use" in error_of(text)


def test_servers_are_checked_without_showing_secrets(monkeypatch):
    monkeypatch.setenv("MCP_T", "t0ps3cret")
    bad = BASE.replace('url: "http://127.0.0.1:9100/mcp", ', "")
    message = error_of(bad)
    assert "mcp_servers.search: a streamable-http MCP server needs url" in message and "t0ps3cret" not in message
    assert "'__' separates" in error_of(
        BASE.replace("  files:", "  my__files:").replace("[files, search]", "[search]").replace("files__*", "search__*")
    )
    assert "url and headers are for" in error_of(BASE.replace("timeout: 30}", 'url: "http://x"}'))


def test_embedded_substitution_is_only_for_mcp_servers(monkeypatch):
    config = parse_config(
        BASE.replace(
            "  plain: {model: builtin:tiny, port: 8001}",
            '  plain: {model: builtin:tiny, port: 8001, owned_by: "a ${env:MCP_T}"}',
        )
    ).config
    assert config.models["plain"].owned_by == "a ${env:MCP_T}"
    assert "MCP_NOT_SET is not set" in error_of(BASE.replace("Bearer ${env:MCP_T}", "Bearer ${env:MCP_NOT_SET}"))


def desktop_file(tmp_path, servers: dict):
    path = tmp_path / "claude_desktop_config.json"
    path.write_text(json.dumps({"mcpServers": servers, "globalShortcut": "x"}))
    return path


def test_a_claude_desktop_file_imports_as_is(tmp_path):
    desktop_file(
        tmp_path,
        {
            "fs": {"command": "npx", "args": ["-y", "server-fs", "/tmp"], "env": {"K": "v"}, "autoApprove": ["read"]},
            "remote": {"url": "https://example.com/mcp", "headers": {"X-Key": "h"}},
            "old": {"type": "sse", "url": "http://localhost:1/sse", "disabled": True},
        },
    )
    text = "mcp_config: claude_desktop_config.json\nmodels:\n  a: {model: builtin:tiny, mcp: [fs, remote]}\n"
    config = parse_config(text, str(tmp_path / "c.yaml")).config
    assert set(config.mcp_servers) == {"fs", "remote", "old"}
    assert config.mcp_servers["remote"].transport == "streamable-http"
    assert config.mcp_servers["old"].transport == "sse" and not config.mcp_servers["old"].enabled
    assert config.models["a"].mcp_servers_resolved["fs"].args == ("-y", "server-fs", "/tmp")
    # A clash with the config's own servers is named.
    clash = "mcp_config: claude_desktop_config.json\nmcp_servers:\n  fs: {command: x}\n"
    assert "MCP server 'fs' is defined here and in mcp_config" in error_of(clash, str(tmp_path / "c.yaml"))


def test_a_models_own_mcp_config_connects_all_its_servers(tmp_path):
    path = desktop_file(tmp_path, {"fs": {"command": "npx"}, "web": {"url": "http://127.0.0.1:1/mcp"}})
    entry = ResolvedModel(model="builtin:tiny", mcp_config=str(path))  # what `vllmmlxd serve --mcp-config` builds
    assert set(entry.mcp_servers_resolved) == {"fs", "web"}
    text = f"models:\n  a: {{model: builtin:tiny, mcp_config: {path.name}}}\n"
    assert set(parse_config(text, str(tmp_path / "c.yaml")).config.models["a"].mcp_servers_resolved) == {"fs", "web"}


def test_bad_mcp_files_are_reported_at_the_key(tmp_path):
    path = tmp_path / "m.json"
    path.write_text("{not json")
    assert error_of("mcp_config: m.json\n", str(tmp_path / "c.yaml")).startswith(
        f"{tmp_path}/c.yaml:1:13: mcp_config: the MCP config file is not JSON"
    )
    path.write_text(json.dumps({"mcpServers": {"x": {"url": "ftp://h", "headers": {"A": "s3cr3t"}}}}))
    with pytest.raises(ValueError) as e:
        load_mcp_file(path)
    assert "server 'x'" in str(e.value) and "s3cr3t" not in str(e.value)
    assert "no such file" in error_of("mcp_config: nope.json\n", str(tmp_path / "c.yaml")).lower()


def test_mcp_fields_are_internal_or_live():
    assert "mcp_servers_resolved" in INTERNAL_FIELDS
    assert {"mcp", "mcp_auto_execute", "mcp_max_tool_calls", "mcp_config", "mcp_servers_resolved"} <= LIVE_FIELDS
    old = parse_config(BASE).config.models["llama"]
    new = parse_config(BASE.replace("timeout: 30", "timeout: 5")).config.models["llama"]
    assert changed_fields(old, new) == ("mcp_servers_resolved",) and classify(changed_fields(old, new)).live
    assert error_of(BASE.replace("    api_keys: [ci]", "    api_keys: [ci]\n    mcp_servers_resolved: {}")).endswith(
        "models.llama.mcp_servers_resolved is filled in by vllmmlxd (from api_keys, mcp); remove it"
    )


def test_tool_filters():
    server = parse_config(
        BASE.replace("timeout: 30}", 'timeout: 30, allow_tools: ["read_*", "list"], deny_tools: ["read_secret*"]}')
    ).config.mcp_servers["files"]
    assert [t for t in ("read_file", "read_secret_key", "list", "write") if server.offers(t)] == ["read_file", "list"]
