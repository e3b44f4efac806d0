"""The gateway section and the entries it routes to: lazy, idle unload, upstreams, names."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from vllmmlxd.config.diff import diff_models
from vllmmlxd.config.schema import INTERNAL_FIELDS, Config, ResolvedUpstream, UpstreamConfig, gateway_token


def config(models: dict, **top) -> Config:
    return Config.model_validate({"models": models, **top})


def test_an_upstream_entry_needs_no_model_and_keeps_a_base_url():
    entry = UpstreamConfig(upstream="http://studio-2.local:8001/v1/", served_model_name="Q")
    assert entry.is_upstream and entry.upstream == "http://studio-2.local:8001"
    assert isinstance(config({"far": {"upstream": "http://h:1"}}).models["far"], ResolvedUpstream)


@pytest.mark.parametrize(
    "fields, error",
    [
        ({}, "give model \\(served here\\) or upstream"),
        ({"model": "builtin:tiny", "upstream": "http://h:1"}, "give model \\(served here\\) or upstream"),
        ({"upstream": "studio-2.local:8001"}, "upstream must be a base URL"),
        ({"upstream": "ftp://h:1"}, "upstream must be a base URL"),
        ({"upstream": "http://h:1", "load": "lazy"}, "load is for a model served here"),
        ({"upstream": "http://h:1", "port": 9000}, "port is for a model served here"),
        ({"model": "builtin:tiny", "idle_unload_s": 60}, "idle_unload_s needs load: lazy"),
        ({"model": "builtin:tiny", "upstream_api_key": "k"}, "upstream_api_key needs upstream"),
        ({"model": "builtin:tiny", "load": "sometimes"}, "'eager' or 'lazy'"),
    ],
)
def test_entries_that_cannot_work_are_refused(fields, error):
    with pytest.raises(ValidationError, match=error):
        config({"x": fields})


def test_the_upstream_key_is_a_secret_sent_only_down_the_pipe():
    entry = ResolvedUpstream(upstream="http://h:1", upstream_api_key="s3cret")
    assert "s3cret" not in repr(entry) and "s3cret" not in str(entry.model_dump())
    assert '"upstream_api_key": "s3cret"' in entry.to_worker_json()


def test_with_a_gateway_a_name_leads_to_one_model():
    with pytest.raises(ValidationError, match="models 'a' and 'b' both answer to 'x'"):
        config(
            {
                "a": {"model": "builtin:tiny", "port": 1, "aliases": ["x"]},
                "b": {"model": "builtin:tiny", "port": 2, "served_model_name": "x"},
            },
            gateway={},
        )
    # Without a gateway each port is its own server: the same served name is fine.
    config(
        {
            "a": {"model": "builtin:tiny", "port": 1, "aliases": ["x"]},
            "b": {"model": "builtin:tiny", "port": 2, "served_model_name": "x"},
        }
    )


def test_the_gateway_port_is_not_a_models_port_and_upstreams_listen_nowhere():
    with pytest.raises(ValidationError, match=r"the gateway and 'a' both listen on 127.0.0.1:8080"):
        config({"a": {"model": "builtin:tiny", "port": 8080}}, gateway={"port": 8080})
    ok = config(
        {
            "a": {"model": "builtin:tiny", "port": 8000},
            "far": {"upstream": "http://h:8000"},
            "far2": {"upstream": "http://h2:8000"},
        },
        gateway={"port": 8080},
    )
    assert ok.gateway.port == 8080


def test_workers_behind_a_gateway_get_the_daemons_token_not_a_trusted_loopback():
    models = {"a": {"model": "builtin:tiny", "trusted_proxies": ["10.0.0.0/8"]}, "far": {"upstream": "http://h:1"}}
    with_gateway = config(models, gateway={})
    # Loopback is not trusted as a proxy: any local program could forge X-Forwarded-For.
    assert with_gateway.models["a"].trusted_proxies == ("10.0.0.0/8",)
    token = with_gateway.models["a"].gateway_token
    assert token == gateway_token() == config(models, gateway={}).models["a"].gateway_token  # one per daemon run
    assert len(token.get_secret_value()) >= 40 and token.get_secret_value() not in repr(with_gateway)
    assert f'"gateway_token": "{token.get_secret_value()}"' in with_gateway.models["a"].to_worker_json()
    assert not hasattr(with_gateway.models["far"], "gateway_token") and config(models).models["a"].gateway_token is None
    assert "gateway_token" in INTERNAL_FIELDS
    with pytest.raises(ValidationError, match=r"models.a.gateway_token is filled in by vllmmlxd"):
        config({"a": {"model": "builtin:tiny", "gateway_token": "mine"}}, gateway={})


def test_the_reload_plan_says_what_changes_in_the_gateway_and_lazy_keys_are_live():
    old = config({"a": {"model": "builtin:tiny"}})
    new = config({"a": {"model": "builtin:tiny", "load": "lazy", "idle_unload_s": 60}}, gateway={"port": 9000})
    plan = diff_models(old, new)
    assert plan.gateway_changed == ("added",) and "gateway: added" in plan.render()
    assert plan.change("a").live and set(plan.changed["a"]) == {"load", "idle_unload_s", "gateway_token"}
    again = config({"a": {"model": "builtin:tiny"}}, gateway={"port": 9001, "ui": False})
    assert diff_models(config({"a": {"model": "builtin:tiny"}}, gateway={"port": 9000}), again).gateway_changed == (
        "port",
        "ui",
    )
    assert diff_models(again, old).gateway_changed == ("removed",)


def test_a_model_may_not_listen_on_the_gateways_ollama_port():
    with pytest.raises(ValidationError, match=r"the gateway and 'm' both listen on 127.0.0.1:11434"):
        config({"m": {"model": "builtin:tiny", "port": 11434}}, gateway={"port": 8080, "ollama_port": 11434})


def test_the_gateway_restarts_for_a_new_ollama_port():
    from vllmmlxd.config.gateway import GatewayConfig
    from vllmmlxd.supervisor.gateway import needs_new_process

    assert needs_new_process(GatewayConfig(), GatewayConfig(ollama_port=11434))
    assert not needs_new_process(GatewayConfig(ollama_port=11434), GatewayConfig(ollama_port=11434, ui=False))
