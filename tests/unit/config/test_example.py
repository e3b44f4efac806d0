"""The shipped configs load, and the example documents every key of the schema."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vllmmlxd.config.keys import key_digest
from vllmmlxd.config.load import load_config, parse_config
from vllmmlxd.config.schema import INTERNAL_FIELDS, DaemonConfig, ModelConfig

CONFIG_DIR = Path(__file__).resolve().parents[3] / "config"
EXAMPLE = CONFIG_DIR / "vllmmlxd.example.yaml"
DEFAULT = CONFIG_DIR / "default.yaml"


def keys_in(text: str) -> set[str]:
    """Keys written in the text, set or commented out (`# api_key: ...`)."""
    return set(re.findall(r"^\s*(?:#\s*)?([a-z_]+):", text, re.MULTILINE))


def test_example_loads_as_a_two_model_cluster():
    config = load_config(EXAMPLE).config
    assert set(config.models) == {"llama", "qwen"}
    llama, qwen = config.models["llama"], config.models["qwen"]
    assert (llama.model, llama.port, llama.served_model_name, llama.owned_by) == (
        "builtin:smollm2-135m-instruct",
        8001,
        "Llama-3.3-70B-Instruct-4bit",
        "maclustr",
    )
    assert (qwen.model, qwen.port, qwen.served_model_name, qwen.owned_by) == (
        "builtin:tiny",
        8002,
        "Qwen2.5-72B-Instruct-4bit",
        "maclustr",
    )


@pytest.mark.parametrize("model", [ModelConfig, DaemonConfig])
def test_example_documents_every_field(model):
    text = EXAMPLE.read_text()
    missing = set(model.model_fields) - keys_in(text) - INTERNAL_FIELDS
    assert not missing, f"add these keys, with a comment, to {EXAMPLE.name}: {sorted(missing)}"
    for name in set(model.model_fields) - INTERNAL_FIELDS:
        # Each key has its one-line comment on the line above.
        above = re.search(rf"^\s*#[^\n]*\n\s*(?:#\s*)?{name}:", text, re.MULTILINE)
        assert above, f"{name} has no comment line above it"


def test_commented_out_keys_in_the_example_are_valid(monkeypatch, tmp_path):
    # Uncommenting a documented key must give a valid config, secrets included.
    monkeypatch.setenv("LLAMA_API_KEY", "k")
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".config" / "vllmmlxd").mkdir(parents=True)
    (tmp_path / ".config" / "vllmmlxd" / "qwen.key").write_text("k2\n")
    fields = set(ModelConfig.model_fields) | set(DaemonConfig.model_fields)
    text = re.sub(
        r"^(\s*)# ([a-z_]+): ",
        lambda m: f"{m[1]}{m[2]}: " if m[2] in fields else m[0],
        EXAMPLE.read_text(),
        flags=re.MULTILINE,
    )
    config = parse_config(text, str(EXAMPLE)).config
    # Only the keys' digests are kept.
    assert config.models["llama"].api_key.get_secret_value() == "sha256:" + key_digest("k")
    assert config.models["qwen"].api_key.get_secret_value() == "sha256:" + key_digest("k2")
    assert config.daemon.state_dir == tmp_path / ".local" / "state" / "vllmmlxd"


def test_default_config_serves_one_model_on_8000():
    config = load_config(DEFAULT).config
    assert list(config.models) == ["default"]
    entry = config.models["default"]
    assert (entry.model, entry.host, entry.port) == ("builtin:smollm2-135m-instruct", "127.0.0.1", 8000)


def test_example_marks_each_model_key_live_or_new_worker_as_the_reload_plan_does():
    from vllmmlxd.config.diff import LIVE_FIELDS

    text = EXAMPLE.read_text()
    for name in set(ModelConfig.model_fields) - INTERNAL_FIELDS:
        above = re.search(rf"^\s*#([^\n]*)\n\s*(?:#\s*)?{name}:", text, re.MULTILINE)[1]
        expected = "(live)" if name in LIVE_FIELDS else "(new worker)"
        assert above.rstrip().endswith(expected), f"{name}: its comment should end with {expected}"
