"""Llama split by tensor when its heads do not divide by the rank count.

mlx-lm's ``Model.shard`` cuts every projection into equal parts, so a llama whose attention
heads (or key/value heads) the rank count does not divide cannot be split: SmolLM2-135M has 9
heads and 3 key/value heads, so not over 2 ranks. Here the heads go to ranks a key/value group
at a time, as evenly as whole groups allow (``runtime.shard_families.kv_group_share``): rank
r computes its groups' queries, keys and values and its part of the output projection, and an
``all_sum`` adds the parts, as mlx's sharded-to-all layer does. The MLP is cut with mlx's own
``shard_linear`` (its width divides; the config checks it). Quantized projections are sliced
too, on whole quantization groups.
"""

from __future__ import annotations

import copy

import mlx.core as mx
import mlx.nn as nn
from mlx.nn.layers.distributed import shard_linear

from vllmmlxd.errors import ModelLoadError
from vllmmlxd.runtime.shard_families import kv_group_share


def _cut(n: int, lo: int, hi: int, whole: int, what: str) -> tuple[int, int]:
    """Rows or columns [lo/whole, hi/whole) of ``n``, which must fall on whole elements."""
    if (lo * n) % whole or (hi * n) % whole:
        raise ModelLoadError(f"cannot split {what} of size {n} at heads {lo}-{hi} of {whole}")
    return lo * n // whole, hi * n // whole


def _sliced(layer: nn.Module, axis: int, lo: int, hi: int, whole: int) -> nn.Module:
    """A copy of a linear layer keeping the rows (``axis`` 0) or input columns (-1) of heads [lo, hi)
    of ``whole``; a column part has no bias (``SumOfParts`` adds it once)."""
    part = copy.copy(layer)
    for name, value in layer.parameters().items():
        if name == "bias" and axis != 0:
            part.pop("bias")
            continue
        n = value.shape[axis]
        i, j = _cut(n, lo, hi, whole, name)
        part[name] = mx.contiguous(value[i:j] if axis == 0 else value[..., i:j])
    return part


class SumOfParts(nn.Module):
    """A projection whose input is split over the ranks: each applies its part, the parts are summed
    (then the bias, once)."""

    def __init__(self, part: nn.Module, bias: mx.array | None, group: mx.distributed.Group):
        super().__init__()
        self.part = part
        self.group = group
        if bias is not None:
            self.bias = bias

    def __call__(self, x: mx.array) -> mx.array:
        y = mx.distributed.all_sum(self.part(x), group=self.group)
        return y + self["bias"] if "bias" in self else y


def heads_divide(model: nn.Module, world: int) -> bool:
    attn = model.model.layers[0].self_attn
    return attn.n_heads % world == 0 and attn.n_kv_heads % world == 0


def shard_by_kv_groups(model: nn.Module, group: mx.distributed.Group) -> None:
    """Split ``model`` (an mlx-lm llama) over ``group``: attention by whole key/value groups, MLP evenly."""
    world, rank = group.size(), group.rank()
    for layer in model.model.layers:
        attn = layer.self_attn
        heads, kv = attn.n_heads, attn.n_kv_heads
        lo, hi = kv_group_share(kv, world, rank)
        per = heads // kv
        attn.q_proj = _sliced(attn.q_proj, 0, lo * per, hi * per, heads)
        attn.k_proj = _sliced(attn.k_proj, 0, lo, hi, kv)
        attn.v_proj = _sliced(attn.v_proj, 0, lo, hi, kv)
        bias = attn.o_proj.get("bias")
        attn.o_proj = SumOfParts(_sliced(attn.o_proj, -1, lo * per, hi * per, heads), bias, group)
        attn.n_heads, attn.n_kv_heads = (hi - lo) * per, hi - lo
        layer.mlp.gate_proj = shard_linear(layer.mlp.gate_proj, "all-to-sharded", group=group)
        layer.mlp.up_proj = shard_linear(layer.mlp.up_proj, "all-to-sharded", group=group)
        layer.mlp.down_proj = shard_linear(layer.mlp.down_proj, "sharded-to-all", group=group)
