"""The tensor split of a llama by key/value groups: the ranks' parts add up to the whole layer.

Each rank's share is built in this one process (a stand-in group gives the rank and size), and
the sum of the ranks' attention outputs is compared with the unsplit attention's: what the
``all_sum`` of ``SumOfParts`` computes across ranks. The two-process run on real weights is in
the sharded e2e tests.
"""

from __future__ import annotations

import copy

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm.models import llama

from tests.support.groups import StandInGroup
from vllmmlxd.engine.distributed import shard_llama


def _model(heads: int, kv: int, bias: bool = False) -> llama.Model:
    mx.random.seed(3)
    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=heads * 16,
        num_hidden_layers=1,
        intermediate_size=192,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        rms_norm_eps=1e-5,
        vocab_size=32,
        attention_bias=bias,
    )
    model = llama.Model(args)
    mx.eval(model.parameters())
    return model


def _attention_parts(model: llama.Model, world: int, x: mx.array) -> list[mx.array]:
    parts = []
    for rank in range(world):
        share = copy.deepcopy(model)
        shard_llama.shard_by_kv_groups(share, StandInGroup(rank, world))  # type: ignore[arg-type]
        attn = share.model.layers[0].self_attn
        # The attention without the sum across ranks: SumOfParts' own part.
        whole_o, attn.o_proj = attn.o_proj, attn.o_proj.part
        parts.append(attn(x) + (whole_o["bias"] if "bias" in whole_o and rank == 0 else 0))
    return parts


@pytest.mark.parametrize("heads, kv, world, bias", [(9, 3, 2, False), (6, 3, 2, True), (8, 4, 3, False)])
def test_the_ranks_attention_parts_sum_to_the_whole(heads, kv, world, bias):
    model = _model(heads, kv, bias)
    x = mx.random.normal((2, 5, heads * 16))
    whole = model.model.layers[0].self_attn(x)
    total = sum(_attention_parts(model, world, x)[1:], _attention_parts(model, world, x)[0])
    assert mx.allclose(total, whole, atol=1e-5).item()


def test_each_rank_keeps_whole_key_value_groups():
    model = _model(9, 3)
    heads = []
    for rank in range(2):
        share = copy.deepcopy(model)
        shard_llama.shard_by_kv_groups(share, StandInGroup(rank, 2))
        attn = share.model.layers[0].self_attn
        heads.append((attn.n_heads, attn.n_kv_heads, attn.q_proj.weight.shape[0], attn.k_proj.weight.shape[0]))
    assert heads == [(6, 2, 6 * 16, 2 * 16), (3, 1, 3 * 16, 1 * 16)]
    assert not shard_llama.heads_divide(model, 2) and shard_llama.heads_divide(model, 3)


def test_a_quantized_model_is_sliced_on_whole_quantization_groups():
    model = _model(8, 4)
    nn.quantize(model, group_size=32, bits=4)
    x = mx.random.normal((1, 3, 8 * 16))
    whole = model.model.layers[0].self_attn(x)
    parts = _attention_parts(model, 2, x)
    assert mx.allclose(parts[0] + parts[1], whole, atol=1e-4).item()
