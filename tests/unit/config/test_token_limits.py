"""max_tokens (the default a request gets) and max_request_tokens (the cap): when only one is
written, the other follows it; only a written default above a written cap is refused."""

from __future__ import annotations

import pytest

from vllmmlxd.config.load import parse_config
from vllmmlxd.config.schema import ModelConfig
from vllmmlxd.errors import ConfigError


def limits(**given) -> tuple[int, int]:
    c = ModelConfig(model="builtin:tiny", **given)
    return c.max_tokens, c.max_request_tokens


def test_a_cap_below_the_default_lowers_the_default():
    assert limits(max_request_tokens=16) == (16, 16)


def test_a_default_above_the_default_cap_raises_the_cap():
    assert limits(max_tokens=40000) == (40000, 40000)


def test_what_was_accepted_before_is_unchanged():
    assert limits() == (32768, 32768)
    assert limits(max_tokens=256) == (256, 32768)
    assert limits(max_tokens=256, max_request_tokens=1024) == (256, 1024)
    assert limits(max_tokens=1024, max_request_tokens=1024) == (1024, 1024)


def test_the_worker_gets_the_same_limits():
    c = ModelConfig(model="builtin:tiny", max_request_tokens=16)
    again = ModelConfig.model_validate_json(c.to_worker_json())
    assert (again.max_tokens, again.max_request_tokens) == (16, 16) and again.config_hash() == c.config_hash()


def test_in_a_file_the_cap_alone_is_accepted_and_a_written_contradiction_named():
    entry = parse_config("models:\n  a:\n    model: builtin:tiny\n    max_request_tokens: 48\n").config.models["a"]
    assert (entry.max_tokens, entry.max_request_tokens) == (48, 48)
    with pytest.raises(ConfigError) as info:
        parse_config(
            "models:\n  a:\n    model: builtin:tiny\n    max_tokens: 64\n    max_request_tokens: 48\n", "c.yaml"
        )
    assert str(info.value) == (
        "c.yaml:2:3: models.a: max_tokens (64), the default, is larger than max_request_tokens "
        "(48), the cap: lower max_tokens or leave it out"
    )
