"""What the store holds, who uses what, and removing a model (refused while an entry uses it)."""

import hashlib
import json
import os

import pytest

from vllmmlxd.errors import StoreError
from vllmmlxd.store.catalog import describe_removal, list_models, remove_model
from vllmmlxd.store.layout import MARKER


def folder(path, marker: dict | None = None, size: int = 100):
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(b"x" * size)
    if marker is not None:
        (path / MARKER).write_text(json.dumps(marker))
    return path


@pytest.fixture
def state(tmp_path):
    models = tmp_path / "models"
    folder(models / "hub-org--a", {"repo": "org/a", "revision": None, "commit": "c0ffee" * 7, "pulled": "T"}, 1000)
    folder(models / "hub-org--half")  # no marker: a pull still installing it
    folder(models / "builtin-tiny-v1", {"built": "T1"})
    folder(models / "builtin-tiny-v2", {"built": "T2"}, 300)
    gguf = tmp_path / "x.gguf"
    gguf.write_bytes(b"GGUF")
    sha = hashlib.sha256(b"GGUF").hexdigest()
    folder(models / f"gguf-{sha[:16]}", {"built": "T3"})
    info = gguf.resolve().stat()
    memo = models / ".gguf-digests" / "m.json"
    memo.parent.mkdir()
    version = f"{gguf.resolve()}\0{info.st_size}\0{info.st_mtime_ns}"
    memo.write_text(json.dumps({"version": version, "path": str(gguf.resolve()), "sha256": sha}))
    partial = folder(tmp_path / "downloads" / "hub" / "hub-org--b")
    (partial / ".cache").mkdir()
    return tmp_path


def test_the_store_lists_pulled_partial_builtin_and_converted_models_with_their_users(state):
    entries = {"qwen": ["org/a", None], "tiny": ["builtin:tiny"], "g": [str(state / "x.gguf")], "far": ["org/zz"]}
    found = {m.name: m for m in list_models(state, entries)}
    sha = hashlib.sha256(b"GGUF").hexdigest()[:16]
    assert list(found) == ["org/a", "org/b", "builtin-tiny-v1", "builtin:tiny", f"gguf-{sha}"]
    a = found["org/a"]
    assert a.kind == "pulled" and a.used_by == ("qwen",) and a.commit == "c0ffee" * 7
    assert a.source == f"org/a @ {'c0ffee' * 2}"
    assert a.size_bytes == 1000 + (state / "models" / "hub-org--a" / MARKER).stat().st_size
    assert found["org/b"].kind == "partial" and "`vllmmlxctl pull org/b` resumes it" in found["org/b"].source
    assert found["builtin:tiny"].used_by == ("tiny",) and found["builtin:tiny"].path.endswith("builtin-tiny-v2")
    assert found["builtin-tiny-v1"].used_by == () and "older build" in found["builtin-tiny-v1"].source
    assert found[f"gguf-{sha}"].used_by == ("g",) and found[f"gguf-{sha}"].source.endswith("x.gguf")
    assert list_models(state, {}, pulling=frozenset({"org/b"}))[1].source == "being pulled now"


def test_a_model_in_use_is_not_removed(state):
    with pytest.raises(StoreError, match=r"org/a is in use by qwen: remove that entry from the config"):
        remove_model("org/a", state, {"qwen": ["org/a"]}, pulling=False)
    assert (state / "models" / "hub-org--a").is_dir()


def test_a_model_being_pulled_is_not_removed(state):
    with pytest.raises(StoreError, match=r"org/a is being pulled: cancel it first"):
        remove_model("org/a", state, {}, pulling=True)


def test_removing_deletes_every_folder_of_the_name(state):
    (state / "downloads" / "hub" / "hub-org--a").mkdir(parents=True)
    (state / "downloads" / "hub" / "hub-org--a" / "config.json").write_text("{}")
    removed = remove_model("org/a", state, {"other": ["org/b"]}, pulling=False)
    assert [m.kind for m in removed] == ["pulled", "partial"]
    assert not (state / "models" / "hub-org--a").exists() and not (state / "downloads" / "hub" / "hub-org--a").exists()
    assert describe_removal(removed).startswith("removed org/a (1.")
    assert not [p for p in (state / "models").iterdir() if p.name.startswith(".tmp-rm")]


def test_a_folder_name_works_too_and_an_unknown_name_says_what_there_is(state):
    assert remove_model("builtin-tiny-v1", state, {}, pulling=False)[0].kind == "builtin"
    with pytest.raises(StoreError, match=r"no model 'org/none' in the store \(it holds: org/a, org/b, builtin:tiny"):
        remove_model("org/none", state, {}, pulling=False)
    assert os.path.isdir(state / "models" / "builtin-tiny-v2")
