"""The api_keys section: names resolved into each entry, digests only, clear errors, live changes."""

from __future__ import annotations

import pytest

from vllmmlxd.config.diff import diff_models
from vllmmlxd.config.keys import key_digest
from vllmmlxd.config.load import parse_config
from vllmmlxd.errors import ConfigError

BASE = """
api_keys:
  alice: {{key: alice-secret, models: ["*"], rate_limit: "60/minute"}}
  ci: {{key_sha256: {}, models: [llama], rate_limit: 5, tokens_per_minute: 20000}}
models:
  llama: {{model: builtin:tiny, api_keys: [alice, ci]}}
  qwen: {{model: builtin:tiny, port: 8001, api_keys: ["*"]}}
  open: {{model: builtin:tiny, port: 8002}}
""".format(key_digest("ci-secret").upper())


def error_of(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "c.yaml")
    return str(info.value)


def test_each_entry_knows_every_key_and_which_it_allows():
    models = parse_config(BASE).config.models
    grants = {g.name: g for g in models["llama"].key_grants}
    assert grants["ci"].sha256 == key_digest("ci-secret")  # upper-case hex is accepted, kept lower
    assert (grants["ci"].rate_limit, grants["ci"].tokens_per_minute) == (5, 20000)
    assert models["llama"].key_names() == ["alice", "ci"]
    # "*": every key whose models patterns match the entry; ci's [llama] does not.
    assert models["qwen"].key_names() == ["alice"] and not models["qwen"].is_open
    assert models["open"].is_open and models["open"].key_grants == ()


def test_only_the_digest_of_a_key_is_kept():
    config = parse_config(BASE).config
    assert config.api_keys["alice"].key is None
    assert config.api_keys["alice"].key_sha256 == key_digest("alice-secret")
    assert "alice-secret" not in repr(config) and key_digest("alice-secret") not in repr(config)


@pytest.mark.parametrize(
    "edit,message",
    [
        (
            ("[alice, ci]", "[alice, bob]"),
            "c.yaml:6:3: models.llama: model 'llama': api_keys[1] names a key the api_keys section does not define; "
            "defined: alice, ci",
        ),
        (("models: [llama]", "models: [qwen]"), "model 'llama' names key 'ci', whose models (qwen) exclude it"),
        (
            ('rate_limit: "60/minute"', 'rate_limit: "lots"'),
            "api_keys.alice.rate_limit: a rate limit is a count per minute or text like",
        ),
        (
            ("key: alice-secret", "key: alice-secret, key_sha256: " + "a" * 64),
            "api_keys.alice: give either key or key_sha256, not both",
        ),
        (("key: alice-secret", "key_sha256: abc"), "key_sha256 must be 64 hex digits"),
        (("alice: {key: alice-secret,", "api_key: {key: alice-secret,"), "key name 'api_key' must be"),
        (
            ("  open: {model: builtin:tiny,", "  open: {model: builtin:tiny, key_grants: [],"),
            "models.open.key_grants is filled in by vllmmlxd",
        ),
    ],
)
def test_mistakes_are_named_without_the_keys(edit, message):
    text = error_of(BASE.replace(*edit))
    assert message in text and "alice-secret" not in text


def test_a_key_without_a_key_is_refused():
    assert "api_keys.bob: give the key as key" in error_of("api_keys:\n  bob: {models: ['*']}\n")


def test_a_key_change_is_a_live_change_of_the_entries_that_use_it():
    old = parse_config(BASE).config
    new = parse_config(BASE.replace("key: alice-secret", "key: alice-rotated")).config
    plan = diff_models(old, new)
    assert plan.changed == {"llama": ("key_grants",), "qwen": ("key_grants",)}  # the open entry is untouched
    assert plan.live == ("llama", "qwen") and "alice-rotated" not in plan.render()
