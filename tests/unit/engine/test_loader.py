"""load_model: spec dispatch, the GGUF cache, builtin:tiny end to end, and (slow) SmolLM2."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_lm import generate

from vllmmlxd.engine.loading import builtin, gguf, loader
from vllmmlxd.engine.loading.loader import LoadedModel, load_model
from vllmmlxd.errors import ModelLoadError
from vllmmlxd.paths import models_dir


def test_unknown_builtin(state_dir):
    with pytest.raises(ModelLoadError, match=r"unknown builtin model 'nope'.*builtin:tiny"):
        load_model("builtin:nope", state_dir)


def test_missing_gguf(tmp_path):
    with pytest.raises(ModelLoadError, match="GGUF file not found"):
        load_model(str(tmp_path / "missing.gguf"), tmp_path)


@pytest.mark.parametrize("spec", ["./nowhere/model", "/nowhere/model", "~/nowhere", "a/b/c"])
def test_missing_path_says_what_was_expected(spec, tmp_path):
    with pytest.raises(ModelLoadError, match=r"model path not found.*folder with config.json.*builtin:NAME"):
        load_model(spec, tmp_path)


def test_folder_without_config_and_plain_file(tmp_path):
    with pytest.raises(ModelLoadError, match=r"expected config.json"):
        load_model(str(tmp_path), tmp_path)
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(ModelLoadError, match="is a file"):
        load_model(str(tmp_path / "weights.bin"), tmp_path)


def test_repo_ids_go_to_the_hub(tmp_path):
    assert loader.resolve_spec("HuggingFaceTB/SmolLM2-135M-Instruct", tmp_path) == (
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        "SmolLM2-135M-Instruct",
    )


def test_context_length_of():
    assert loader.context_length_of({"max_position_embeddings": 8192}) == 8192
    assert loader.context_length_of({"text_config": {"max_position_embeddings": 1024}}) == 1024
    assert loader.context_length_of({}) == 4096


def test_gguf_is_converted_once_into_the_state_dir(toy_gguf, tmp_path):
    state = tmp_path / "state"
    first = load_model(str(toy_gguf), state)
    digest = gguf.file_sha256(toy_gguf)[:16]
    assert first.path == models_dir(state) / f"gguf-{digest}"
    assert (first.name, first.context_length) == ("toy-model", 512)
    marker = first.path / gguf.MARKER
    stamp = marker.stat().st_mtime_ns
    second = load_model(str(toy_gguf), state)
    assert second.path == first.path and marker.stat().st_mtime_ns == stamp
    # Nothing else but the remembered digest: no temp folder left behind.
    assert sorted(p.name for p in models_dir(state).iterdir()) == sorted([gguf.DIGESTS, first.path.name])


def test_cpu_runs_half_precision_models_in_float32(toy_gguf, tmp_path):
    loaded = load_model(str(toy_gguf), tmp_path)
    dtypes = {v.dtype for _, v in tree_flatten(loaded.model.parameters())}
    assert dtypes == ({mx.float32} if mx.default_device() == mx.cpu else {mx.float16})


def test_tiny_loads_and_generates_deterministically(state_dir):
    a, b = load_model("builtin:tiny", state_dir), load_model("builtin:tiny", state_dir)
    assert isinstance(a, LoadedModel)
    assert (a.name, a.context_length, a.path) == ("tiny", 2048, builtin.BUILTINS["tiny"].folder(state_dir))
    expected = builtin.make_tiny_weights()
    for (name, wa), (_, wb) in zip(tree_flatten(a.model.parameters()), tree_flatten(b.model.parameters())):
        assert wa.dtype == mx.float32
        np.testing.assert_array_equal(np.array(wa), np.array(wb))
        np.testing.assert_array_equal(np.array(wa), expected[name])
    prompt = a.tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    outputs = [generate(m.model, m.tokenizer, prompt, max_tokens=8) for m in (a, b)]
    assert outputs[0] == outputs[1] and outputs[0]


def test_a_folder_spec_loads_directly(state_dir):
    folder = builtin.ensure_builtin("tiny", state_dir)
    loaded = load_model(str(folder), state_dir)
    assert (loaded.path, loaded.name, loaded.context_length) == (folder, "builtin-tiny-v2", 2048)


@pytest.mark.slow
def test_smollm2_knows_the_capital_of_france(state_dir):
    loaded = load_model("builtin:smollm2-135m-instruct", state_dir)
    assert (loaded.name, loaded.context_length) == ("smollm2-135m-instruct", 8192)
    prompt = loaded.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True
    )
    text = generate(loaded.model, loaded.tokenizer, prompt, max_tokens=30)
    assert "Paris" in text
