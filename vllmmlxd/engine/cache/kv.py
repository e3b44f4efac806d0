"""KV cache operations the prefix caches need, on mlx-lm's per-layer cache objects.

``MLXKVOps``: whole sequences (``prefix_cache.EntryCache``). ``BlockKV``: blocks of positions
with every layer stacked in one array for keys and one for values, so a block costs two arrays
rather than two per layer (cutting a sequence into blocks and joining them back cost about a
whole copy: measured on SmolLM2's KV, 2,000 positions, in 16- to 256-token blocks alike), held
quantized with ``kv_bits``; and the host bytes the disk tier writes.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass
from typing import Any, cast

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache, can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache

from .block_file import Tensor


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

    # The same two operations as the block ops (``BlockKV``), for a sharded entry's other ranks (batch.Mirror):
    # a whole entry is one piece, cut from a sequence and joined back alone.
    def cut(self, cache: list[Any], spans: list[tuple[int, int]]) -> list[list[Any]]:
        ((start, end),) = spans
        assert start == 0  # a whole entry starts at the sequence's start
        return [self.adopt(cache, end)]

    def join(self, blocks: list[list[Any]], n: int) -> list[Any]:
        (entry,) = blocks
        return self.copy_prefix(entry, n)


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


# safetensors' names of the dtypes a KV block holds (block_file.py).
_DTYPE_NAMES = {mx.float32: "F32", mx.float16: "F16", mx.bfloat16: "BF16", mx.uint32: "U32"}
_DTYPES = {v: k for k, v in _DTYPE_NAMES.items()}


@dataclass(frozen=True)
class KVLayout:
    """The shape of a model's attention KV: what a block's arrays must look like to be read back."""

    layers: int
    heads: int
    kdim: int
    vdim: int
    dtype: str  # mx's name: float32, float16, bfloat16

    def describe(self) -> dict:
        return {
            "layers": self.layers,
            "kv_heads": self.heads,
            "k_dim": self.kdim,
            "v_dim": self.vdim,
            "dtype": self.dtype,
        }


@dataclass(frozen=True)
class KVBlock:
    """One block's KV, every layer stacked: keys and values (L, H, n, D) each, or, quantized, the
    (weights, scales, biases) of each flattened to (L, H, n·D) and padded to a whole group."""

    tokens: int
    keys: tuple[mx.array, ...]
    values: tuple[mx.array, ...]
    kdim: int
    vdim: int


def probe_layout(model: Any) -> KVLayout | None:
    """The model's KV layout, from one token run through a fresh cache; None when it is not plain,
    uniform attention KV. Runs the model: not on a sharded entry's ranks (collectives)."""
    cache = make_prompt_cache(model)
    if not cache or not all(type(c) is KVCache for c in cache):
        return None
    model(mx.array([[0]]), cache=cache)
    mx.eval([a for c in cache for a in (c.keys, c.values)])
    ops = BlockKV()
    if not ops.blockable(cache):
        return None
    k, v = cache[0].keys, cache[0].values
    return KVLayout(len(cache), k.shape[1], k.shape[3], v.shape[3], _dtype_name(k.dtype))


class BlockKV:
    """Cut a sequence's KV into blocks, join blocks into a private cache; ``bits``: blocks are held
    quantized (``mx.quantize``, groups of ``group_size`` along each head's flattened positions)."""

    def __init__(self, bits: int | None = None, group_size: int = 64, layout: KVLayout | None = None):
        self.bits = bits
        self.group_size = group_size
        self.layout = layout  # known (probed) when blocks are read back from disk: they are checked against it

    def blockable(self, cache: list[Any]) -> bool:
        """Plain attention KV in every layer, one row, the same heads, dims, dtype and length in each."""
        if not cache or not all(type(c) is KVCache and c.keys is not None and c.values is not None for c in cache):
            return False
        k, v, n = cache[0].keys, cache[0].values, cache[0].offset
        return all(
            c.keys.shape[:2] == k.shape[:2] == (1, k.shape[1])
            and c.keys.shape[3] == k.shape[3]
            and c.values.shape[3] == v.shape[3]
            and c.keys.dtype == k.dtype
            and c.offset == n
            for c in cache
        )

    def positions(self, cache: list[Any]) -> int:
        return int(cache[0].offset)

    def cut(self, cache: list[Any], spans: list[tuple[int, int]]) -> list[KVBlock]:
        """Compact blocks of positions [start, end) for each span (consecutive), evaluated together."""
        return self.cut_arrays([c.keys for c in cache], [c.values for c in cache], spans)

    def cut_arrays(
        self, layer_keys: list[mx.array], layer_values: list[mx.array], spans: list[tuple[int, int]], origin: int = 0
    ) -> list[KVBlock]:
        """``cut`` of layers' keys and values whose first position is ``origin``. Each layer's run
        is split once and each block joins its layers' pieces in one copy: a slice a layer a
        block costs an op each, thousands for a long sequence (4x slower)."""
        if not spans:
            return []
        keys: list[list[mx.array]]
        values: list[list[mx.array]]
        if all(a[1] == b[0] for a, b in itertools.pairwise(spans)):
            first, stop = spans[0][0] - origin, spans[-1][1] - origin
            cuts = [start - origin - first for start, _ in spans[1:]]
            keys = [_split(k[..., first:stop, :], cuts) for k in layer_keys]
            values = [_split(v[..., first:stop, :], cuts) for v in layer_values]
        else:  # blocks with gaps between them (a follower's copy of what rank 0 kept)
            keys = [[k[..., a - origin : b - origin, :] for a, b in spans] for k in layer_keys]
            values = [[v[..., a - origin : b - origin, :] for a, b in spans] for v in layer_values]
        out = []
        for i, (start, end) in enumerate(spans):
            k = mx.concatenate([layer[i] for layer in keys], axis=0)
            v = mx.concatenate([layer[i] for layer in values], axis=0)
            out.append(KVBlock(end - start, self._pack(k), self._pack(v), k.shape[3], v.shape[3]))
        mx.eval([a for b in out for a in (*b.keys, *b.values)])
        return out

    def join(self, blocks: list[KVBlock], n: int) -> list[Any]:
        """A private per-layer cache of the first ``n`` positions the blocks hold, in order."""
        k, v = self.join_arrays(blocks, n)
        out = []
        for layer in range(k.shape[0]):
            c = KVCache()
            c.keys, c.values, c.offset = k[layer : layer + 1], v[layer : layer + 1], n
            out.append(c)
        mx.eval([a for c in out for a in (c.keys, c.values)])
        return out

    def join_arrays(self, blocks: list[KVBlock], n: int) -> tuple[mx.array, mx.array]:
        """The blocks' keys and values, every layer stacked (L, H, n, D), first ``n`` positions."""
        k = self._concat([self._unpack(b.keys, b.tokens, b.kdim) for b in blocks], n)
        v = self._concat([self._unpack(b.values, b.tokens, b.vdim) for b in blocks], n)
        return k, v

    def nbytes(self, block: KVBlock) -> int:
        return sum(a.nbytes for a in (*block.keys, *block.values))

    def to_tensors(self, block: KVBlock, prefix: str = "") -> dict[str, Tensor]:
        """Host copies of the block's arrays (on the engine thread: the disk writer gets bytes, not arrays)."""
        out = {}
        for part, arrays in (("keys", block.keys), ("values", block.values)):
            for suffix, a in zip(_PARTS if self.bits else ("",), arrays):
                out[prefix + part + suffix] = host_tensor(a)
        return out

    def from_tensors(self, tensors: dict[str, Tensor], tokens: int) -> KVBlock:
        """A block read back; ValueError unless every array is what this layout's block must be."""
        if self.layout is None:
            raise ValueError("no KV layout to check a block against")
        block = self.read(tensors, tokens, self.layout)
        if len(tensors) != self.arrays:
            raise ValueError("arrays this block does not have")
        mx.eval([*block.keys, *block.values])
        return block

    @property
    def arrays(self) -> int:
        """Arrays a block holds (keys and values, each in three parts when quantized)."""
        return 6 if self.bits else 2

    def read(self, tensors: dict[str, Tensor], tokens: int, layout: KVLayout, prefix: str = "") -> KVBlock:
        """The block of ``layout`` among ``tensors`` (names after ``prefix``), its arrays not evaluated;
        ValueError unless each is what such a block must hold."""
        parts = {}
        for part, dim in (("keys", layout.kdim), ("values", layout.vdim)):
            arrays = []
            for suffix, (dtype, shape) in zip(_PARTS if self.bits else ("",), self._shapes(layout, tokens, dim)):
                name = prefix + part + suffix
                arrays.append(device_array(tensors.get(name), name, dtype, shape))
            parts[part] = tuple(arrays)
        return KVBlock(tokens, parts["keys"], parts["values"], layout.kdim, layout.vdim)

    def _shapes(self, layout: KVLayout, tokens: int, dim: int) -> list[tuple[str, tuple[int, ...]]]:
        lead = (layout.layers, layout.heads)
        dtype = _DTYPE_NAMES[_DTYPES_BY_NAME[layout.dtype]]
        if not self.bits:
            return [(dtype, (*lead, tokens, dim))]
        width = _padded(tokens * dim, self.group_size)
        groups = width // self.group_size
        return [("U32", (*lead, width * self.bits // 32)), (dtype, (*lead, groups)), (dtype, (*lead, groups))]

    def _pack(self, x: mx.array) -> tuple[mx.array, ...]:
        if not self.bits:
            return (x,)
        layers, heads, n, dim = x.shape
        flat = x.reshape(layers, heads, n * dim)
        pad = _padded(n * dim, self.group_size) - n * dim
        if pad:
            flat = mx.concatenate([flat, mx.zeros((layers, heads, pad), flat.dtype)], axis=2)
        return tuple(mx.quantize(flat, group_size=self.group_size, bits=self.bits))

    def _unpack(self, arrays: tuple[mx.array, ...], n: int, dim: int) -> mx.array:
        if not self.bits:
            return arrays[0]
        w, scales, biases = arrays
        flat = mx.dequantize(w, scales, biases, group_size=self.group_size, bits=self.bits)
        return flat[..., : n * dim].reshape(flat.shape[0], flat.shape[1], n, dim)

    @staticmethod
    def _concat(parts: list[mx.array], n: int) -> mx.array:
        x = parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=2)
        return x if x.shape[2] == n else x[:, :, :n, :]


_PARTS = (".weight", ".scales", ".biases")
_DTYPES_BY_NAME = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


def _padded(n: int, group: int) -> int:
    return -(-n // group) * group


def host_tensor(a: mx.array) -> Tensor:
    """A host copy of ``a`` as the disk tier writes it (bfloat16 too: numpy has no such dtype)."""
    return Tensor(_dtype_name_safetensors(a.dtype), tuple(a.shape), np.array(a.view(mx.uint8), copy=True))


def device_array(t: Tensor | None, name: str, dtype: str, shape: tuple[int, ...]) -> mx.array:
    """A tensor read back as an array; ValueError unless it is a ``dtype`` of ``shape``."""
    if t is None or t.dtype != dtype or t.shape != shape:
        raise ValueError(f"{name}: not a {dtype}{list(shape)}")
    return mx.array(np.frombuffer(t.data, np.uint8)).view(_DTYPES[dtype]).reshape(shape)


def _dtype_name(dtype: Any) -> str:
    for name, d in _DTYPES_BY_NAME.items():
        if d == dtype:
            return name
    raise ValueError(f"KV of dtype {dtype} is not held in blocks")


def _dtype_name_safetensors(dtype: Any) -> str:
    return _DTYPE_NAMES[dtype]


def _split(x: mx.array, cuts: list[int]) -> list[mx.array]:
    """``x`` split along its positions at ``cuts``: one op for every piece."""
    return list(cast(Any, mx.split(x, cuts, axis=2)))
