"""The routing table the daemon publishes to the gateway: built from the entries and their states."""

from __future__ import annotations

from pathlib import Path

from vllmmlxd.config.gateway import GatewayConfig, GatewaySpec, embedding_display_name
from vllmmlxd.config.schema import Config
from vllmmlxd.supervisor.gateway import build_spec, connect_url


def test_workers_are_reached_over_loopback_when_bound_to_every_address():
    assert connect_url("0.0.0.0", 8001) == "http://127.0.0.1:8001"
    assert connect_url("::", 8001) == "http://[::1]:8001"
    assert connect_url("192.168.1.5", 8001) == "http://192.168.1.5:8001"


def test_a_route_per_entry_with_its_names_state_and_keys():
    config = Config.model_validate(
        {
            "gateway": {"port": 8080},
            "api_keys": {"alice": {"key": "alice-key", "models": ["llama"]}},
            "models": {
                "llama": {
                    "model": "builtin:tiny",
                    "port": 8001,
                    "served_model_name": "Llama-3",
                    "aliases": ["l"],
                    "api_keys": ["alice"],
                    "embedding_model": "builtin:all-minilm-l6-v2",
                },
                "qwen": {"model": "builtin:tiny", "host": "0.0.0.0", "port": 8002, "load": "lazy"},
                "far": {"upstream": "http://studio-2.local:8001", "served_model_name": "Q72", "upstream_api_key": "up"},
            },
        }
    )
    spec = build_spec(
        config.gateway,
        config.models,
        {"llama": ("ready", None), "qwen": ("unloaded", None), "far": ("unreachable", "cannot reach")},
        Path("/s/control.sock"),
    )
    llama, qwen, far = spec.routes
    assert llama.names() == ("Llama-3", "llama", "l") and llama.embedding_model == "all-minilm-l6-v2"
    assert llama.url == "http://127.0.0.1:8001" and not llama.is_open and llama.key_grants[0].allowed
    assert (qwen.url, qwen.load, qwen.state, qwen.is_open) == ("http://127.0.0.1:8002", "lazy", "unloaded", True)
    assert (far.kind, far.url, far.state, far.last_error) == (
        "upstream",
        "http://studio-2.local:8001",
        "unreachable",
        "cannot reach",
    )
    assert spec.control_socket == "/s/control.sock"
    # Secrets travel only down the gateway's pipe, never in its repr.
    assert "up" not in repr(far.upstream_api_key) and '"upstream_api_key": "up"' in spec.to_worker_json()
    again = GatewaySpec.model_validate_json(spec.to_worker_json())
    assert again.config_hash() == spec.config_hash() and again.routes[2].upstream_api_key.get_secret_value() == "up"


def test_a_gateway_spec_is_what_a_slot_needs_of_a_config():
    spec = GatewaySpec(gateway=GatewayConfig(host="::1", port=9000))
    assert (spec.host, spec.port, spec.display_name("gateway")) == ("::1", 9000, "gateway")


def test_the_embedding_model_is_named_as_its_worker_serves_it():
    assert embedding_display_name("builtin:all-minilm-l6-v2") == "all-minilm-l6-v2"
    assert embedding_display_name("/models/bge-small/") == "bge-small"
    assert embedding_display_name(None) is None
