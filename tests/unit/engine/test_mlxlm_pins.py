"""mlx-lm's private parts that vllmmlxd uses exist in the installed mlx-lm, and only
``engine/batch/mlxlm.py`` names them: an mlx-lm upgrade that renames one fails here first, named."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm.generate import BatchGenerator
from mlx_lm.models.cache import BatchKVCache, RotatingKVCache

from tests.support.families import build
from vllmmlxd.engine.batch import mlxlm

PKG = Path(__file__).resolve().parents[3] / "vllmmlxd"
NAMES = {name for names in mlxlm.PRIVATE.values() for name in names}


@pytest.fixture(scope="module")
def stepped() -> BatchGenerator:
    """A real generator over a tiny model, one row decoding: every batch it keeps is made."""
    model = build("llama", "float32")
    gen = BatchGenerator(model, completion_batch_size=2, prefill_batch_size=2, prefill_step_size=16)
    gen.insert([[1, 2, 3]], max_tokens=[4])
    for _ in range(3):  # the prompt, its last token's pass, one answer token
        gen.next()
    return gen


def instances(gen: BatchGenerator) -> dict[str, object]:
    return {
        "mlx_lm.generate.BatchGenerator": gen,
        "mlx_lm.generate.GenerationBatch": mlxlm.generation_batch(gen),
        "mlx_lm.models.cache.BatchKVCache": BatchKVCache([0]),
        "mlx_lm.models.cache.RotatingKVCache": RotatingKVCache(8),
    }


def test_every_private_attribute_used_exists_in_the_installed_mlx_lm(stepped):
    made = instances(stepped)
    assert set(made) == set(mlxlm.PRIVATE)
    missing = []
    for where, names in mlxlm.PRIVATE.items():
        module, _, cls = where.rpartition(".")
        assert isinstance(made[where], getattr(importlib.import_module(module), cls))
        missing += [f"{where}.{name}" for name in names if not hasattr(made[where], name)]
    assert missing == [], f"mlx-lm renamed its private parts: update engine/batch/mlxlm.py for {missing}"


def test_the_accessors_read_what_mlx_lm_keeps(stepped):
    batch = mlxlm.generation_batch(stepped)
    assert mlxlm.counted(batch) == [1] and len(mlxlm.matchers(batch)) == 1
    assert mlxlm.written(batch.prompt_cache[0]) == 4  # the prompt, and the answer token fed back
    rotating = RotatingKVCache(8)
    rotating.update_and_fetch(mx.zeros((1, 1, 3, 4)), mx.zeros((1, 1, 3, 4)))
    assert mlxlm.written(rotating) == 3


def test_no_other_module_names_mlx_lms_private_parts():
    found = []
    for path in sorted(PKG.rglob("*.py")):
        if path.name == "mlxlm.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in NAMES:
                found.append(f"{path.relative_to(PKG)}:{node.lineno}: .{node.attr}")
    assert found == []
