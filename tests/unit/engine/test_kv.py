"""kv.py on real mlx arrays: stored prefixes are compact and free the batch buffer they came from;
blocks join back into the positions they were cut from, quantized ones close and small, through host
bytes and back."""

from __future__ import annotations

import gc

import mlx.core as mx
import pytest
from mlx_lm.models.cache import KVCache, RotatingKVCache

from vllmmlxd.engine.cache.block_file import Tensor
from vllmmlxd.engine.cache.kv import BlockKV, KVLayout, MLXKVOps


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


# -- blocks -------------------------------------------------------------------


def random_cache(layers: int, positions: int, dtype=mx.float32, heads: int = 2, dim: int = 16) -> list[KVCache]:
    out = []
    for _ in range(layers):
        c = KVCache()
        c.update_and_fetch(
            mx.random.normal((1, heads, positions, dim)).astype(dtype),
            mx.random.normal((1, heads, positions, dim)).astype(dtype),
        )
        out.append(c)
    mx.eval([a for c in out for a in (c.keys, c.values)])
    return out


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
def test_blocks_cut_from_a_sequence_join_back_into_its_positions(dtype):
    ops = BlockKV()
    source = random_cache(layers=3, positions=70, dtype=dtype)
    assert ops.blockable(source) and ops.positions(source) == 70
    blocks = ops.cut(source, [(0, 32), (32, 64), (64, 70)])
    assert [b.tokens for b in blocks] == [32, 32, 6]
    assert ops.nbytes(blocks[0]) == 32 * 3 * 2 * 2 * 16 * (4 if dtype == mx.float32 else 2)
    joined = ops.join(blocks, 69)
    for got, want in zip(joined, source):
        assert got.offset == 69 and got.keys.shape == (1, 2, 69, 16) and got.keys.dtype == dtype
        assert mx.array_equal(got.keys, want.keys[..., :69, :]).item()
        assert mx.array_equal(got.values, want.values[..., :69, :]).item()


def test_blocks_with_gaps_between_them_hold_their_own_positions():
    ops = BlockKV()  # a follower cuts what rank 0 kept: some blocks of a run may have been evicted
    source = random_cache(layers=2, positions=100, dtype=mx.float32)
    for spans in ([(32, 64), (64, 96)], [(0, 32), (64, 96), (96, 100)]):
        for block, (a, b) in zip(ops.cut(source, spans), spans):
            want = mx.concatenate([c.keys[..., a:b, :] for c in source])
            assert block.tokens == b - a and mx.array_equal(block.keys[0], want).item()


def test_quantized_blocks_take_at_most_055x_the_bytes_and_stay_close():
    plain, eight = BlockKV(), BlockKV(bits=8, group_size=64)
    source = random_cache(layers=2, positions=64, dtype=mx.float16, dim=64)
    full, small = plain.cut(source, [(0, 32)])[0], eight.cut(source, [(0, 32)])[0]
    assert eight.nbytes(small) <= 0.55 * plain.nbytes(full)
    joined = eight.join(eight.cut(source, [(0, 32), (32, 37)]), 36)
    for got, want in zip(joined, source):
        assert got.keys.shape == (1, 2, 36, 64) and got.keys.dtype == mx.float16
        assert mx.abs(got.keys - want.keys[..., :36, :]).max().item() < 0.05
    assert (
        eight.nbytes(eight.cut(random_cache(2, 32, mx.float32, dim=64), [(0, 32)])[0]) <= 0.3 * 32 * 2 * 2 * 2 * 64 * 4
    )


@pytest.mark.parametrize("bits", [None, 8, 4])
def test_a_block_round_trips_through_host_bytes_and_is_checked_against_the_layout(bits):
    source = random_cache(layers=2, positions=32, dtype=mx.bfloat16, heads=2, dim=16)
    layout = KVLayout(layers=2, heads=2, kdim=16, vdim=16, dtype="bfloat16")
    ops = BlockKV(bits=bits, layout=layout)
    (block,) = ops.cut(source, [(0, 32)])
    tensors = ops.to_tensors(block)
    back = ops.from_tensors({k: Tensor(t.dtype, t.shape, bytes(t.data)) for k, t in tensors.items()}, 32)
    for a, b in zip((*block.keys, *block.values), (*back.keys, *back.values)):
        assert a.dtype == b.dtype and mx.array_equal(a, b).item()
    other = BlockKV(bits=bits, layout=KVLayout(layers=3, heads=2, kdim=16, vdim=16, dtype="bfloat16"))
    with pytest.raises(ValueError):
        other.from_tensors(tensors, 32)  # another model's layout: refused, never misread


def test_only_plain_uniform_attention_kv_is_blockable():
    ops = BlockKV()
    assert not ops.blockable([RotatingKVCache(max_size=8)])
    assert not ops.blockable(random_cache(1, 8) + random_cache(1, 9))  # lengths differ
    assert not ops.blockable(random_cache(1, 8, dim=16) + random_cache(1, 8, dim=32))
    assert not ops.blockable([])
