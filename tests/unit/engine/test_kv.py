"""kv.py on real mlx arrays: stored prefixes are compact and free the batch buffer they came from."""

from __future__ import annotations

import gc

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from vllmmlxd.engine.kv import MLXKVOps


def filled(layers: int, positions: int, capacity: int) -> list[KVCache]:
    out = []
    for _ in range(layers):
        c = KVCache()
        c.keys = mx.ones((1, 2, capacity, 16))
        c.values = mx.ones((1, 2, capacity, 16))
        c.offset = positions
        out.append(c)
    mx.eval([a for c in out for a in (c.keys, c.values)])
    return out


def test_a_prefix_copy_holds_only_its_positions_and_lets_the_source_go():
    ops = MLXKVOps()
    gc.collect()
    before = mx.get_active_memory()
    source = filled(layers=2, positions=300, capacity=4096)
    copy = ops.copy_prefix(source, 100)
    per_position = 2 * 2 * 2 * 16 * 4  # layers x (keys, values) x heads x dims x float32
    assert ops.nbytes(copy) == 100 * per_position
    assert all(c.offset == 100 and c.keys.shape[2] == 100 for c in copy)
    del source
    gc.collect()
    # What stays is the copy, not the 4096-position buffers it was cut from.
    assert mx.get_active_memory() - before <= 2 * ops.nbytes(copy)
    assert ops.trimmable(copy)


def test_adopt_keeps_an_exact_extraction_and_copies_anything_else():
    ops = MLXKVOps()
    exact = filled(layers=1, positions=64, capacity=64)
    assert ops.adopt(exact, 64) is exact
    longer = filled(layers=1, positions=64, capacity=256)
    adopted = ops.adopt(longer, 64)
    assert adopted is not longer and adopted[0].keys.shape[2] == 64
