"""No config error shows a value: a secret read by ${file:..} under any key, in any shape,
never appears in load_config's error or in `vllmmlxctl check`'s output, whatever the outcome."""

from __future__ import annotations

import pytest

from vllmmlxd.config.gateway import GatewayConfig
from vllmmlxd.config.keys import ApiKeyConfig
from vllmmlxd.config.load import load_config
from vllmmlxd.config.mcp import McpServerConfig
from vllmmlxd.config.schema import INTERNAL_FIELDS, DaemonConfig, ModelConfig
from vllmmlxd.ctl.cli import main as ctl_main
from vllmmlxd.errors import ConfigError

SECRET = "sk-live-Zq9-do-not-print"
SUB = "${file:secret}"
# Each section, the model of its entries, and what an entry needs besides the key under test.
SECTIONS = [
    ("models", "x", ModelConfig, "model: builtin:tiny"),
    ("daemon", None, DaemonConfig, ""),
    ("gateway", None, GatewayConfig, ""),
    ("api_keys", "k", ApiKeyConfig, "key: abc"),
    ("mcp_servers", "s", McpServerConfig, "command: echo"),
]
# A valid model spec is what the memory plan is about: `check` shows it on purpose.
SHOWN = {"model", "embedding_model"}
SHAPES = {"scalar": SUB, "list": f'["{SUB}"]', "mapping": f'{{a: "{SUB}"}}'}


def _cases():
    for section, entry, model, base in SECTIONS:
        for field in sorted(set(model.model_fields) - INTERNAL_FIELDS):
            for shape in SHAPES:
                yield pytest.param(section, entry, base, field, shape, id=f"{section}.{field}-{shape}")
    for shape in SHAPES:
        yield pytest.param(None, None, "", "mcp_config", shape, id=f"mcp_config-{shape}")


def _write(tmp_path, section, entry, base, field, shape):
    (tmp_path / "secret").write_text(SECRET + "\n")
    value = SHAPES[shape]
    if section is None:
        text = f"{field}: {value}\n"
    elif entry is None:
        text = f"{section}:\n  {field}: {value}\n"
    else:
        own = f"    {base}\n" if base and not base.startswith(field + ":") else ""
        if section == "models" and field == "upstream":
            own = ""  # model and upstream exclude each other
        text = f"{section}:\n  {entry}:\n{own}    {field}: {value}\n"
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("section, entry, base, field, shape", list(_cases()))
def test_no_error_shows_the_value(tmp_path, capsys, section, entry, base, field, shape):
    path = _write(tmp_path, section, entry, base, field, shape)
    try:
        load_config(path)
    except ConfigError as e:
        assert SECRET not in str(e)
        assert field in str(e) or "top level" in str(e) or section in str(e)  # it names where
    ctl_main(["check", str(path)])
    out, err = capsys.readouterr()
    if field in SHOWN and section == "models" and shape == "scalar":
        return
    assert SECRET not in out + err


@pytest.mark.parametrize(
    "key, value",
    [
        ("blas", SECRET),
        ("tool_call_parser", SECRET),
        ("reasoning_parser", SECRET),
        ("upstream", "ftp://" + SECRET),
        ("rate_limit", SECRET),
        ("trusted_proxies", SECRET),
        ("model", "builtin:" + SECRET),
    ],
)
def test_a_refused_value_is_named_by_its_key(tmp_path, key, value):
    (tmp_path / "secret").write_text(value)
    entry = "upstream: ${file:secret}" if key == "upstream" else f"model: builtin:tiny\n    {key}: ${{file:secret}}"
    if key == "model":
        entry = "model: ${file:secret}"
    path = tmp_path / "c.yaml"
    path.write_text(f"models:\n  x:\n    {entry}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert f"models.x.{key}" in message and SECRET not in message
