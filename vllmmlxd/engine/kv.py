"""KV cache operations the prefix cache needs, on mlx-lm's per-layer cache objects."""

from __future__ import annotations

import copy
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import KVCache, can_trim_prompt_cache, trim_prompt_cache


class MLXKVOps:
    """Copy a prefix compactly, count real bytes, tell trimmable caches apart."""

    def copy_prefix(self, cache: list[Any], n: int) -> list[Any]:
        out = [_copy_layer(layer, n) for layer in cache]
        mx.eval([a for layer in out for a in _arrays(layer)])
        return out

    def adopt(self, cache: list[Any], n: int) -> list[Any]:
        # A batch's extraction is already a compact copy of exactly its positions: evaluate it
        # (a lazy slice would keep the batch's whole buffer alive) instead of copying it again.
        if all(type(layer) is KVCache and layer.keys is not None and layer.keys.shape[2] == n for layer in cache):
            mx.eval([a for layer in cache for a in (layer.keys, layer.values)])
            return cache
        return self.copy_prefix(cache, n)

    def nbytes(self, cache: list[Any]) -> int:
        return sum(layer.nbytes for layer in cache)

    def trimmable(self, cache: list[Any]) -> bool:
        return can_trim_prompt_cache(cache)


def _copy_layer(layer: Any, n: int) -> Any:
    if type(layer) is KVCache:
        # Only the first n positions, as fresh arrays: a slice would keep a batch's whole buffer alive.
        new = KVCache()
        if layer.keys is not None and layer.values is not None and n > 0:  # set together
            new.keys = mx.contiguous(layer.keys[..., :n, :])
            new.values = mx.contiguous(layer.values[..., :n, :])
            new.offset = n
        return new
    clone = copy.deepcopy(layer)  # other cache kinds (rotating, quantized, recurrent) copy whole
    excess = clone.size() - n if hasattr(clone, "size") else 0
    if excess > 0:
        trim_prompt_cache([clone], excess)
    return clone


def _arrays(layer: Any) -> list[mx.array]:
    state = getattr(layer, "state", ())
    return [a for a in (state if isinstance(state, (list, tuple)) else [state]) if isinstance(a, mx.array)]
