"""A model entry is composed of one model per concern, read from the same flat keys; what the daemon
resolves is set by validation, never by changing a frozen model."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from vllmmlxd.config.entries import CONCERNS, INTERNAL_FIELDS, ModelConfig, ResolvedModel, UpstreamConfig
from vllmmlxd.config.load import parse_config
from vllmmlxd.config.schema import Config, gateway_token
from vllmmlxd.errors import ConfigError

CONFIG = Path(__file__).resolve().parents[3] / "vllmmlxd" / "config"


def test_each_key_belongs_to_one_concern_and_the_entry_is_all_of_them():
    owners: dict[str, str] = {}
    for title, model in CONCERNS.items():
        for key in model.model_fields:
            assert owners.setdefault(key, title) == title, f"{key} is in {owners[key]} and {title}"
    own = {"distributed", "speculative"}  # sections of the entry itself
    assert set(ModelConfig.model_fields) == set(owners) | own
    assert all(issubclass(ModelConfig, model) for model in CONCERNS.values())


def test_the_flat_keys_are_read_by_their_concerns():
    entry = parse_config("models:\n  a:\n    model: builtin:tiny\n    max_images: 2\n    blas: mkl\n").config.models[
        "a"
    ]
    assert (entry.max_images, entry.blas, entry.port) == (2, "mkl", 8000)


def test_a_validator_is_shared_not_copied():
    # `x` for a list of one, and the networks check, wherever the keys are (entries and the gateway).
    text = "gateway:\n  trusted_proxies: 10.0.0.0/8\nmodels:\n  a:\n    model: builtin:tiny\n    trusted_proxies: ::1\n"
    config = parse_config(text).config
    assert config.gateway is not None and config.gateway.trusted_proxies == ("10.0.0.0/8",)
    assert config.models["a"].trusted_proxies == ("::1",)


def test_the_gateway_refuses_a_proxy_that_is_no_network_at_load():
    # It used to pass the config and fail the gateway process when it built its access rules.
    with pytest.raises(ConfigError, match=r"c\.yaml:2:3: gateway\.trusted_proxies: trusted_proxies\[0\] is not an IP"):
        parse_config("gateway:\n  trusted_proxies: [proxy.local]\n", "c.yaml")


@pytest.mark.parametrize(
    "given, default, cap",
    [({}, 32768, 32768), ({"max_request_tokens": 16}, 16, 16), ({"max_tokens": 65536}, 65536, 65536)],
)
def test_the_default_and_the_cap_follow_each_other_as_they_are_read(given, default, cap):
    entry = ModelConfig(model="builtin:tiny", **given)
    assert (entry.max_tokens, entry.max_request_tokens) == (default, cap)
    assert ModelConfig.model_validate_json(entry.model_dump_json()) == entry  # read again, the same entry


def test_a_model_with_its_own_mcp_file_resolves_it_when_read(tmp_path):
    path = tmp_path / "mcp.json"
    path.write_text('{"mcpServers": {"fs": {"command": "echo"}}}')
    entry = ResolvedModel(model="builtin:tiny", mcp_config=str(path))
    assert list(entry.mcp_servers_resolved) == ["fs"]
    with pytest.raises(ValidationError, match="cannot read the MCP config file"):
        ResolvedModel(model="builtin:tiny", mcp_config=str(tmp_path / "missing.json"))


def test_the_gateway_token_is_resolved_into_each_local_entry():
    models = {"a": {"model": "builtin:tiny"}, "b": {"upstream": "http://h:1"}}
    config = Config.model_validate({"gateway": {"port": 9000}, "models": models})
    a = config.models["a"]
    assert isinstance(a, ResolvedModel) and a.gateway_token == gateway_token()
    assert not hasattr(config.models["b"], "gateway_token")
    assert Config.model_validate({"models": models}).models["a"].gateway_token is None


def test_internal_fields_are_the_resolved_kinds_own_and_refused_in_a_file():
    assert sorted(INTERNAL_FIELDS) == ["gateway_token", "key_grants", "mcp_servers_resolved", "telemetry"]
    assert INTERNAL_FIELDS.isdisjoint(ModelConfig.model_fields) and INTERNAL_FIELDS.isdisjoint(
        UpstreamConfig.model_fields
    )
    with pytest.raises(ConfigError, match=r"models\.a\.key_grants is filled in by vllmmlxd"):
        parse_config("models:\n  a:\n    model: builtin:tiny\n    key_grants: []\n")


def test_no_frozen_model_is_changed_in_place():
    offenders = [p.name for p in CONFIG.glob("*.py") if "object.__setattr__" in p.read_text()]
    assert offenders == []


def test_each_config_module_stays_small():
    sizes = {p.name: len(p.read_text().splitlines()) for p in CONFIG.glob("*.py")}
    assert max(sizes.values()) <= 500, sizes
