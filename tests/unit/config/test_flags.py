"""flags.py: `vllmmlxd serve`'s flags and the model entry's schema agree, key for key."""

from __future__ import annotations

import argparse

import pytest
from pydantic import BaseModel, Field

from vllmmlxd.config.entries import INTERNAL_FIELDS, ModelConfig
from vllmmlxd.config.flags import (
    FLAG_FORMS,
    NOT_FLAGS,
    OWN_FLAGS,
    SECTION_GROUPS,
    add_flags,
    entry_values,
    flag_name,
    serve_flags,
)


def sections() -> dict[str, type[BaseModel]]:
    """The entry's keys that are sections of their own (cache_disk, speculative...)."""
    out = {}
    for key, info in ModelConfig.model_fields.items():
        for tp in (info.annotation, *getattr(info.annotation, "__args__", ())):
            if isinstance(tp, type) and issubclass(tp, BaseModel):
                out[key] = tp
    return out


def test_every_key_of_the_entry_is_a_flag_or_says_why_it_is_not():
    keys = set(ModelConfig.model_fields) - INTERNAL_FIELDS
    flagged = {flag.key.split(".")[0] for flag in serve_flags()}
    assert flagged.isdisjoint(NOT_FLAGS) and flagged.isdisjoint(OWN_FLAGS) and set(NOT_FLAGS).isdisjoint(OWN_FLAGS)
    assert flagged | set(NOT_FLAGS) | set(OWN_FLAGS) == keys
    for section, model in sections().items():
        if section in flagged:  # a section's every key is a flag of its own
            subkeys = {f.key.split(".")[1] for f in serve_flags() if f.key.startswith(section + ".")}
            assert subkeys == set(model.model_fields), section


def test_the_exceptions_and_forms_name_keys_the_entry_has():
    keys = set(ModelConfig.model_fields)
    subkeys = {f"{s}.{k}" for s, model in sections().items() for k in model.model_fields}
    assert set(NOT_FLAGS) <= keys and set(OWN_FLAGS) <= keys
    assert set(FLAG_FORMS) <= keys | subkeys and set(SECTION_GROUPS) <= set(sections())


def test_a_new_key_is_a_flag_with_no_line_in_flags_py():
    class Newer(ModelConfig):
        new_knob: int = Field(3, ge=1, description="a knob")
        new_switch: bool = Field(False, description="a switch")

    flags = {f.key: f for f in serve_flags(Newer)}
    assert flags["new_knob"].name == "--new-knob" and flags["new_knob"].options["help"] == "a knob (default: 3)"
    parser = argparse.ArgumentParser()
    add_flags(parser, flags.values())
    args = parser.parse_args(["--new-knob", "5", "--new-switch"])
    assert entry_values(args, flags.values()) == {"new_knob": 5, "new_switch": True}


def test_a_new_key_a_flag_cannot_take_fails_until_it_says_why():
    class Newer(ModelConfig):
        labels: dict[str, str] = Field(default_factory=dict)

    with pytest.raises(TypeError, match="labels: no flag form"):
        serve_flags(Newer)


def test_flags_left_out_are_absent_and_a_section_is_made_of_its_flags():
    flags = serve_flags()
    parser = argparse.ArgumentParser()
    add_flags(parser, flags)
    assert entry_values(parser.parse_args([]), flags) == {}
    args = parser.parse_args(["--cache-disk-budget-gb", "3", "--num-draft", "2", "--no-continuous-batching"])
    assert entry_values(args, flags) == {
        "cache_disk": {"budget_gb": 3.0},
        "speculative": {"num_draft": 2},
        "continuous_batching": False,
    }
    assert entry_values(parser.parse_args(["--speculative", "off"]), flags) == {"speculative": False}


def test_an_error_names_the_flag_of_its_key():
    flags = serve_flags()
    assert flag_name(("max_queue",), flags) == "--max-queue"
    assert flag_name(("speculative", "num_draft"), flags) == "--num-draft"
    assert flag_name(("cache_disk", "budget_gb"), flags) == "--cache-disk-budget-gb"
    assert flag_name(("allowed_image_hosts", 0), flags) == "--allowed-image-hosts"
    assert flag_name(("speculative",), flags) == "--speculative"
    assert flag_name(("model",), flags) == "MODEL"
