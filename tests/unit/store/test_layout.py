"""Where a model is on disk: the store's copy first, then huggingface_hub's cache."""

import json

import pytest

from vllmmlxd.store.layout import (
    MARKER,
    folder_name,
    hub_folder,
    not_downloaded,
    pull_hint,
    repo_of,
    store_copy,
)


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    cache = tmp_path / "hf"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


def pulled(state, repo: str):
    folder = state / "models" / folder_name(repo)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    return folder


def test_folder_names_read_back_to_their_repo():
    assert folder_name("mlx-community/Qwen3-0.6B-4bit") == "hub-mlx-community--Qwen3-0.6B-4bit"
    assert repo_of("hub-mlx-community--Qwen3-0.6B-4bit") == "mlx-community/Qwen3-0.6B-4bit"
    assert repo_of("builtin-tiny-v2") is None and repo_of("hub-nodash") is None and repo_of("gguf-1234") is None


def test_a_store_copy_counts_once_its_marker_is_written(tmp_path, hub_cache):
    folder = pulled(tmp_path, "org/m")
    assert store_copy("org/m", tmp_path) is None and not_downloaded("org/m", tmp_path) == "org/m"
    (folder / MARKER).write_text(json.dumps({"repo": "org/m"}))
    assert store_copy("org/m", tmp_path) == folder == hub_folder("org/m", tmp_path)
    assert not_downloaded("org/m", tmp_path) is None


def test_the_hub_cache_counts_as_downloaded(tmp_path, hub_cache):
    snapshot = hub_cache / "models--org--c" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (hub_cache / "models--org--c" / "refs").mkdir()
    (hub_cache / "models--org--c" / "refs" / "main").write_text("abc")
    assert hub_folder("org/c", tmp_path) == snapshot and not_downloaded("org/c", tmp_path) is None


def test_only_hub_ids_can_be_not_downloaded(tmp_path, hub_cache, monkeypatch):
    for spec in ("builtin:tiny", "/x/model.gguf", "./folder", "~/m"):
        assert not_downloaded(spec, tmp_path) is None
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "here").mkdir(parents=True)  # a folder of that name is a folder, as in the loader
    assert not_downloaded("org/here", tmp_path) is None


def test_the_hint_names_the_pull_and_the_entry():
    assert pull_hint("org/m") == "org/m is not downloaded: run `vllmmlxctl pull org/m`"
    assert pull_hint("org/m", "qwen") == (
        "org/m is not downloaded: run `vllmmlxctl pull org/m`, then `vllmmlxctl start qwen` "
        "(or set download: true on qwen to have the daemon download it)"
    )
