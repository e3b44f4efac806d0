"""Replica sets in the config: ``group:`` on local and upstream entries, and the sets refused at load."""

from __future__ import annotations

import pytest

from vllmmlxd.config.diff import LIVE_FIELDS
from vllmmlxd.config.groups import members_by_group
from vllmmlxd.config.load import parse_config
from vllmmlxd.errors import ConfigError

GATEWAY = "gateway: {port: 8080}\n"
A = "  a:\n    model: builtin:tiny\n    port: 8001\n"
B = "  b:\n    model: builtin:tiny\n    port: 8002\n"


def error_of(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "c.yaml")
    return str(info.value)


def test_local_and_upstream_entries_form_one_group_and_keep_their_own_names():
    text = (
        GATEWAY + "models:\n" + A + "    group: tiny\n"
        "  far:\n    upstream: http://studio-2.local:8001\n    served_model_name: far-tiny\n    group: tiny\n" + B
    )
    models = parse_config(text).config.models
    assert members_by_group(models) == {"tiny": ["a", "far"]}
    assert (models["a"].group, models["far"].group, models["b"].group) == ("tiny", "tiny", None)
    assert models["far"].display_name("far") == "far-tiny"
    assert "group" in LIVE_FIELDS  # read by the gateway only: a change needs no new worker


def test_a_group_needs_the_gateway():
    text = "models:\n" + A + "    group: tiny\n" + B + "    group: tiny\n"
    assert error_of(text) == (
        "c.yaml:2:3: models.a: group needs a gateway section: the gateway answers a group's name (model 'a')"
    )


def test_a_group_needs_two_entries():
    text = GATEWAY + "models:\n" + A + B + "    group: tiny\n"
    assert error_of(text) == (
        "c.yaml:6:3: models.b: group has one entry: a group needs at least 2, each with the same group (model 'b')"
    )


@pytest.mark.parametrize(
    "extra",
    ["  tiny:\n    upstream: http://h:1\n", "    aliases: [tiny]\n", "    served_model_name: tiny\n"],
    ids=["entry key", "alias", "served name"],
)
def test_a_group_name_no_entry_answers_to(extra):
    text = GATEWAY + "models:\n" + A + "    group: tiny\n" + B + "    group: tiny\n" + extra
    owner = "tiny" if extra.startswith("  tiny") else "b"
    assert error_of(text) == (
        f"c.yaml:3:3: models.a: model {owner!r} already answers to the name of the group of model 'a' (as its key, "
        "served_model_name or an alias): a group needs a name of its own (model 'a')"
    )


@pytest.mark.parametrize(
    "b_keys",
    ["", "    api_key: other\n", "    api_keys: [ci]\n"],
    ids=["open", "another key", "named keys"],
)
def test_members_let_the_same_callers_in(b_keys):
    keys = "api_keys:\n  ci: {key: sk-ci-1}\n"
    text = keys + GATEWAY + "models:\n" + A + "    group: tiny\n    api_key: sk-a\n" + B + "    group: tiny\n" + b_keys
    message = error_of(text)
    assert message == (
        "c.yaml:10:3: models.b: entries of one group differ in who may call them: give them the same "
        "api_key/api_keys (model 'a' and 'b')"
    )
    assert "sk-a" not in message and "other" not in message


def test_the_same_key_or_the_same_key_names_in_another_order_agree():
    keys = "api_keys:\n  ci: {key: sk-ci-1}\n  ops: {key: sk-ops-1}\n"
    same = "    group: tiny\n    api_key: sk-a\n    api_keys: [ci, ops]\n"
    other_order = "    group: tiny\n    api_key: sk-a\n    api_keys: [ops, ci]\n"
    models = parse_config(keys + GATEWAY + "models:\n" + A + same + B + other_order).config.models
    assert models["a"].api_key == models["b"].api_key


def test_a_group_name_is_a_plain_name():
    text = GATEWAY + "models:\n" + A + "    group: 'a b'\n" + B + "    group: 'a b'\n"
    assert error_of(text) == "c.yaml:3:3: models.a: group must be letters, digits, '_', '.' or '-' (model 'a')"
