"""mcp_auto_execute: SERVER__TOOL patterns, or a bare server name for every tool of that server."""

from __future__ import annotations

import json
from fnmatch import fnmatchcase

import pytest

from vllmmlxd.config.diff import diff_models
from vllmmlxd.config.load import parse_config
from vllmmlxd.config.schema import ResolvedModel
from vllmmlxd.errors import ConfigError

TEXT = """
mcp_servers:
  calc: {command: echo, deny_tools: [secret_*]}
  other: {command: echo}
models:
  a: {model: builtin:tiny, mcp: [calc, other], mcp_auto_execute: AUTO}
"""


def entry(auto: str) -> ResolvedModel:
    model = parse_config(TEXT.replace("AUTO", auto)).config.models["a"]
    assert isinstance(model, ResolvedModel)  # served here, not an upstream
    return model


def runs(config: ResolvedModel, tool: str) -> bool:
    # As the worker decides (api/tool_loop.py offer): the server's allow/deny lists, then the patterns.
    server, name = tool.split("__", 1)
    return config.mcp_servers_resolved[server].offers(name) and any(
        fnmatchcase(tool, p) for p in config.mcp_auto_execute
    )


def test_a_bare_server_name_means_every_tool_its_lists_let_through():
    config = entry("[calc]")
    assert config.mcp_auto_execute == ("calc__*",)
    assert [t for t in ("calc__add", "calc__mul", "calc__secret_key", "other__add") if runs(config, t)] == [
        "calc__add",
        "calc__mul",
    ]


def test_bare_names_mix_with_patterns_and_a_single_name_is_a_list():
    assert entry("[calc, other__add]").mcp_auto_execute == ("calc__*", "other__add")
    assert entry("calc").mcp_auto_execute == ("calc__*",)
    assert entry('["*"]').mcp_auto_execute == ("*",)


def test_the_worker_gets_the_normalised_pattern_and_a_reload_sees_no_change():
    bare, written = entry("[calc]"), entry("[calc__*]")
    assert json.loads(bare.to_worker_json())["mcp_auto_execute"] == ["calc__*"]
    assert bare.config_hash() == written.config_hash()
    old = parse_config(TEXT.replace("AUTO", "[calc]")).config
    new = parse_config(TEXT.replace("AUTO", "[calc__*]")).config
    assert diff_models(old, new).is_empty


def test_a_bare_name_of_a_server_the_model_does_not_use_is_refused():
    text = TEXT.replace("mcp: [calc, other]", "mcp: [other]").replace("AUTO", "[calc]")
    with pytest.raises(ConfigError) as info:
        parse_config(text, "c.yaml")
    assert str(info.value) == (
        "c.yaml:6:3: models.a: model 'a': mcp_auto_execute[0] names an MCP server the model "
        "does not use; it uses: other"
    )
