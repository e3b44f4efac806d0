"""GGUF → MLX conversion: permutation, dequantization, naming, tokenizer, real SmolLM2."""

from __future__ import annotations

import json
import os
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models import llama, qwen2
from mlx_lm.utils import load as mlx_lm_load
from mlx_lm.utils import load_tokenizer

from tests.unit.engine.conftest import (
    llama_cpp_permute,
    to_gguf_tensors,
    toy_hf_weights,
    toy_metadata,
    toy_tokens,
    write_toy_gguf,
)
from vllmmlxd.engine.loading import gguf
from vllmmlxd.engine.loading.builtin import ensure_builtin
from vllmmlxd.errors import ModelLoadError


@pytest.mark.parametrize("shape,n_head", [((24, 5), 3), ((16, 8), 4), ((12, 2), 1), ((32,), 2)])
def test_unpermute_undoes_llama_cpp_permute(shape, n_head):
    w = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    permuted = llama_cpp_permute(w, n_head)
    assert not np.array_equal(permuted, w)
    np.testing.assert_array_equal(np.array(gguf.permute_rope(mx.array(w), n_head)), permuted)
    np.testing.assert_array_equal(np.array(gguf.unpermute_rope(mx.array(permuted), n_head)), w)
    np.testing.assert_array_equal(np.array(gguf.permute_rope(gguf.unpermute_rope(mx.array(w), n_head), n_head)), w)


@pytest.mark.parametrize("bits", [4, 8])
def test_dequantize_tensors_folds_triples(bits):
    w = mx.random.normal((64, 128), key=mx.random.key(0))
    q, scales, biases = mx.quantize(w, group_size=32, bits=bits)
    out = gguf.dequantize_tensors({"x.weight": q, "x.scales": scales, "x.biases": biases, "n.weight": mx.ones((4,))})
    assert set(out) == {"x.weight", "n.weight"}
    assert out["x.weight"].shape == (64, 128) and out["x.weight"].dtype == mx.float16
    expected = mx.dequantize(q, scales, biases, group_size=32, bits=bits)
    assert mx.array_equal(out["x.weight"], expected.astype(mx.float16))
    assert mx.abs(out["x.weight"].astype(mx.float32) - w).max().item() < (0.5 if bits == 4 else 0.05)


def test_to_mlx_weights_names_and_unpermutes(toy_gguf):
    hf = toy_hf_weights()
    tensors, meta = gguf.load_gguf(toy_gguf)
    out = gguf.to_mlx_weights(tensors, meta)
    assert set(out) == set(hf)
    for name, value in hf.items():
        np.testing.assert_allclose(np.array(out[name].astype(mx.float32)), value, atol=2e-3)


def test_unknown_tensor_is_rejected():
    tensors = {"rope_freqs.weight": mx.ones((4,))}
    with pytest.raises(ModelLoadError, match="rope_freqs"):
        gguf.to_mlx_weights(tensors, toy_metadata())


def test_toy_conversion_matches_reference_llama(toy_gguf, tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    gguf.convert_gguf(toy_gguf, folder)
    config = json.loads((folder / "config.json").read_text())
    assert config["tie_word_embeddings"] is False and config["rope_traditional"] is False
    assert (config["max_position_embeddings"], config["num_key_value_heads"], config["rms_norm_eps"]) == (512, 2, 1e-5)
    model, tokenizer = mlx_lm_load(str(folder))

    # The reference: mlx-lm's llama built straight from the HF-layout weights.
    args = llama.ModelArgs.from_dict(config)
    reference = llama.Model(args)
    reference.load_weights([(k, mx.array(v).astype(mx.float16)) for k, v in toy_hf_weights().items()])
    tokens = mx.array([[1, 50, 60, 70, 80, 90, 100, 2]])
    np.testing.assert_allclose(
        np.array(model(tokens).astype(mx.float32)), np.array(reference(tokens).astype(mx.float32)), atol=2e-2
    )
    assert tokenizer.encode(" the") == [toy_tokens().index("Ġthe")]
    assert tokenizer.encode("<|im_start|>") == [1]


def test_qwen2_is_converted_without_unpermuting(tmp_path):
    hf = toy_hf_weights()
    rng = np.random.default_rng(2)
    for layer in range(2):
        for proj, size in (("q", 32), ("k", 16), ("v", 16)):
            hf[f"model.layers.{layer}.self_attn.{proj}_proj.bias"] = rng.normal(0, 0.2, size).astype(np.float32)
    meta = {k.replace("llama.", "qwen2."): v for k, v in toy_metadata(**{"general.architecture": "qwen2"}).items()}
    path = tmp_path / "qwen.gguf"
    mx.save_gguf(str(path), to_gguf_tensors(hf, permute=False), meta)
    folder = tmp_path / "out"
    folder.mkdir()
    gguf.convert_gguf(path, folder)
    model, _ = mlx_lm_load(str(folder))
    reference = qwen2.Model(qwen2.ModelArgs.from_dict(json.loads((folder / "config.json").read_text())))
    reference.load_weights([(k, mx.array(v).astype(mx.float16)) for k, v in hf.items()])
    tokens = mx.array([[1, 50, 60, 70, 2]])
    np.testing.assert_allclose(
        np.array(model(tokens).astype(mx.float32)), np.array(reference(tokens).astype(mx.float32)), atol=2e-2
    )


def test_unsupported_architecture_is_named(tmp_path):
    path = write_toy_gguf(tmp_path / "m.gguf", **{"general.architecture": "falcon"})
    with pytest.raises(ModelLoadError, match="'falcon'"):
        gguf.convert_gguf(path, tmp_path)


def test_spm_tokenizer_is_rejected_clearly():
    with pytest.raises(ModelLoadError, match="tokenizer model 'llama' is not supported"):
        gguf.make_tokenizer(toy_metadata(**{"tokenizer.ggml.model": "llama"}))


def test_build_once_keeps_a_complete_folder(tmp_path):
    calls = []

    def build(folder: Path) -> None:
        calls.append(folder)
        (folder / "x").write_text("1")

    target = tmp_path / "models" / "thing"
    assert gguf.build_once(target, build) == target
    assert gguf.build_once(target, build) == target
    assert len(calls) == 1 and (target / "x").read_text() == "1" and (target / gguf.MARKER).exists()
    assert [p.name for p in target.parent.iterdir()] == ["thing"]  # no temp dirs left behind


def test_build_once_replaces_an_incomplete_folder_and_cleans_up_on_failure(tmp_path):
    target = tmp_path / "thing"
    target.mkdir()
    (target / "half-written").write_text("")

    def fail(folder: Path) -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        gguf.build_once(target, fail)
    assert list(tmp_path.iterdir()) == []
    gguf.build_once(target, lambda folder: None)
    assert sorted(p.name for p in target.iterdir()) == [gguf.MARKER]


@pytest.fixture(scope="module")
def smollm2_folder(state_dir) -> Path:
    return ensure_builtin("smollm2-135m-instruct", state_dir)


def test_real_smollm2_conversion_loads_with_mlx_lm(smollm2_folder):
    config = json.loads((smollm2_folder / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (30, 576, 49152)
    assert config["tie_word_embeddings"] is True and config["max_position_embeddings"] == 8192
    model, _ = mlx_lm_load(str(smollm2_folder), lazy=True)
    assert model.model.layers[0].self_attn.q_proj.weight.shape == (576, 576)


def test_real_smollm2_tokenizer(smollm2_folder):
    tok = load_tokenizer(smollm2_folder)
    assert tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>", "<|endoftext|>"]) == [1, 2, 0]
    assert (tok.bos_token_id, tok.eos_token_id, tok.eos_token_ids) == (1, 2, {2})
    text = "Hello world! Ünïcödé, tabs\tand 12345 digits 🎉\n  indented"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.encode("<|im_start|>user\nhi<|im_end|>")[:1] == [1] and tok.encode("x<|im_end|>")[-1] == 2
    assert tok.encode(" 123") == tok.encode(" ") + [tok.convert_tokens_to_ids(c) for c in "123"]  # digits one by one
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert prompt.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_build_once_loser_of_the_race_keeps_the_winners_folder(tmp_path):
    target = tmp_path / "thing"

    def build(folder: Path) -> None:
        (folder / "mine").write_text("")
        # Another process finishes and renames its folder into place first.
        theirs = tmp_path / "theirs"
        theirs.mkdir()
        (theirs / "theirs").write_text("")
        (theirs / gguf.MARKER).write_text("{}")
        theirs.rename(target)

    assert gguf.build_once(target, build) == target
    assert sorted(p.name for p in target.iterdir()) == sorted([gguf.MARKER, "theirs"])
    assert [p.name for p in tmp_path.iterdir()] == ["thing"]


def test_a_gguf_is_hashed_once_per_version(tmp_path, monkeypatch):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"weights-1")
    memo = tmp_path / "models" / gguf.DIGESTS
    reads = []
    real = gguf.file_sha256
    monkeypatch.setattr(gguf, "file_sha256", lambda p: reads.append(p) or real(p))
    first = gguf.remembered_sha256(model, memo)
    assert first == real(model)
    assert gguf.remembered_sha256(tmp_path / "." / "m.gguf", memo) == first  # same resolved file: no read
    assert len(reads) == 1
    model.write_bytes(b"weights-2, longer")  # a new version: new size and mtime
    assert gguf.remembered_sha256(model, memo) == real(model) != first
    assert len(reads) == 2


def test_abandoned_temp_folders_are_removed_and_live_builds_kept(tmp_path):
    import subprocess
    import sys

    target = tmp_path / "gguf-abc"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    abandoned = tmp_path / f".tmp-gguf-abc-{dead_pid}-x1"
    live = tmp_path / f".tmp-gguf-abc-{os.getppid()}-x2"
    legacy_old, legacy_new = tmp_path / ".tmp-gguf-abc-q1zz", tmp_path / ".stale-gguf-abc-qq"  # names without a pid
    other = tmp_path / f".tmp-gguf-other-{dead_pid}-x3"
    for folder in (abandoned, live, legacy_old, legacy_new, other):
        folder.mkdir()
    os.utime(legacy_old, (0, 0))  # untouched for ages
    removed = gguf.remove_abandoned_builds(target)
    assert sorted(removed) == sorted([abandoned, legacy_old])
    assert live.exists() and legacy_new.exists() and other.exists()
    gguf.build_once(target, lambda folder: None)  # also at every start of a build
    assert (target / gguf.MARKER).exists()
