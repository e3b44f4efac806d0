"""builtin:NAME specs: the config knows the engine's builtins (without importing it) and refuses
any other name, so `vllmmlxctl check`, `run` and a reload refuse it before a worker starts."""

from __future__ import annotations

import pytest

from vllmmlxd.config.load import parse_config
from vllmmlxd.config.schema import BUILTIN_MODELS, ModelConfig
from vllmmlxd.ctl.cli import main as ctl_main
from vllmmlxd.errors import ConfigError


def test_the_config_knows_every_builtin_and_no_other():
    from vllmmlxd.config.names import BUILTIN_KINDS
    from vllmmlxd.engine.loading.builtin import BUILTINS, builtin_names

    assert sorted(BUILTIN_MODELS) == builtin_names()
    assert {name: b.kind for name, b in BUILTINS.items()} == BUILTIN_KINDS


@pytest.mark.parametrize("name", BUILTIN_MODELS)
def test_each_builtin_is_accepted(name):
    assert parse_config(f"models:\n  a:\n    model: builtin:{name}\n").config.models["a"].model == f"builtin:{name}"


@pytest.mark.parametrize("key", ["model", "embedding_model"])
def test_an_unknown_builtin_is_refused_at_its_key_naming_the_builtins(key):
    text = "models:\n  a:\n    model: builtin:tiny\n" if key == "embedding_model" else "models:\n  a:\n"
    text += f"    {key}: builtin:tinyy\n"
    with pytest.raises(ConfigError) as info:
        parse_config(text, "c.yaml")
    line = 4 if key == "embedding_model" else 3
    column = len(f"    {key}: ") + 1
    assert str(info.value) == (
        f"c.yaml:{line}:{column}: models.a.{key}: unknown builtin model; the builtins are "
        "builtin:all-minilm-l6-v2, builtin:smollm2-135m-instruct, builtin:tiny, builtin:tiny-reranker, "
        "builtin:tiny-vlm, builtin:tiny-whisper"
    )


def test_other_specs_are_not_checked_here():
    # Paths and hub ids are found (or not) when the worker loads them.
    for spec in ("~/models/x.gguf", "mlx-community/Qwen3-0.6B-4bit", "./builtin:tiny"):
        assert ModelConfig(model=spec).model == spec


def test_check_refuses_an_unknown_builtin(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("models:\n  a:\n    model: builtin:tinyy\n")
    assert ctl_main(["check", str(path)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err == (
        f"{path}:3:12: models.a.model: unknown builtin model; the builtins are "
        "builtin:all-minilm-l6-v2, builtin:smollm2-135m-instruct, builtin:tiny, builtin:tiny-reranker, "
        "builtin:tiny-vlm, builtin:tiny-whisper\n"
    )
