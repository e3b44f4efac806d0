"""Prefix-cache blocks for models whose layers are not all attention: sliding windows and recurrent
states beside (or instead of) full attention (Gemma 3/4, GPT-OSS, Qwen3.5/3.6, Qwen3-Next,
Nemotron-H, LFM2...).

A block holds, for its positions, the KV of every full-attention layer (stacked, as
``kv.BlockKV`` holds a plain model's) and the KV of every windowed layer (stacked apart: their
heads may differ). A windowed layer keeps only its last ``window`` positions, so its part of a
block is cut while the block is still in the window (``capture``: after each prefill chunk,
and from the final cache); a block whose windowed part was never seen is not stored, and the
path of blocks ends before it. A recurrent layer's state is not positional at all: it is
copied whole at chosen positions (``checkpoints.py``) and kept on the block that ends there.

A sequence continues from position ``n`` with: the attention KV of ``[0, n)``, each windowed
layer's last ``window`` positions before ``n`` (a ``RotatingKVCache`` in time order, as
mlx-lm's own would hold after a prefill), and the state checkpointed at ``n``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache, make_prompt_cache

from ..batch.layout import CacheLayout
from ..batch.mlxlm import set_written
from .block_file import Tensor
from .checkpoints import Captures
from .kv import BlockKV, KVBlock, KVLayout, device_array, host_tensor

State = tuple[tuple[mx.array, ...], ...]  # a checkpoint: each recurrent layer's arrays, one row


@dataclass(frozen=True)
class Block:
    """One block of a layered model's sequence: its attention and windowed layers' KV."""

    tokens: int
    attention: KVBlock | None
    window: KVBlock | None


@dataclass(frozen=True)
class LayeredShapes:
    """What a block's and a checkpoint's arrays must be to be read back from disk (probed once)."""

    attention: KVLayout | None
    window: KVLayout | None
    states: tuple[tuple[tuple[str, tuple[int, ...]], ...], ...]  # each state layer's (dtype, shape) arrays

    def describe(self) -> dict:
        return {
            "attention": self.attention.describe() if self.attention else None,
            "window": self.window.describe() if self.window else None,
            "states": [[[d, list(s)] for d, s in layer] for layer in self.states],
        }


class LayeredKV:
    """Cut a layered model's sequence into ``Block``s and join them back, with its state."""

    def __init__(self, layout: CacheLayout, block: int, bits: int | None = None, group_size: int = 64):
        self.cache_layout = layout
        self.block = block
        self.attention = layout.indices("attention")
        self.windows = layout.windows
        self.states = layout.states
        self.kv = BlockKV(bits, group_size)
        self.shapes: LayeredShapes | None = None  # known when blocks are read back from disk

    # -- what the cache asks ------------------------------------------------

    def blockable(self, cache: list[Any]) -> bool:
        """One row's cache of this layout: attention KV, windows and states in their places."""
        if len(cache) != len(self.cache_layout.layers):
            return False
        for i in self.attention:
            c = cache[i]
            if type(c) is not KVCache or c.keys is None or c.keys.shape[0] != 1:
                return False
        for i in self.windows:
            if type(cache[i]) is not RotatingKVCache or cache[i].keys is None:
                return False
        for i in self.states:
            c = cache[i]
            if type(c) is not ArraysCache or any(a is None or a.shape[0] != 1 for a in c.cache):
                return False
        return True

    def positions(self, cache: list[Any]) -> int | None:
        """The positions ``cache`` holds, where an attention or windowed layer says (a model of
        recurrent layers alone does not know)."""
        for i in (*self.attention, *self.windows):
            return int(cache[i].offset)
        return None

    def cut(self, cache: list[Any], spans: list[tuple[int, int]], captures: Captures | None = None) -> list[Block]:
        """Blocks of positions [start, end) for each span; the windowed parts from what the
        sequence captured and what its final cache still holds. Stops at the first block whose
        windowed part is not known (the blocks after it would have no parent)."""
        windows: list[KVBlock] = []
        if self.windows:
            windows = self._window_parts([cache[i] for i in self.windows], spans, captures or Captures())
            spans = spans[: len(windows)]
        if not spans:
            return []
        attention: list[KVBlock | None] = [None] * len(spans)
        if self.attention:
            keys, values = [cache[i].keys for i in self.attention], [cache[i].values for i in self.attention]
            attention = list(self.kv.cut_arrays(keys, values, spans))
        return [
            Block(end - start, kv, windows[n] if windows else None)
            for n, ((start, end), kv) in enumerate(zip(spans, attention))
        ]

    def _window_parts(self, final: list[Any], spans: list[tuple[int, int]], captures: Captures) -> list[KVBlock]:
        """The windowed KV of the spans, in order, as far as it is known: captured blocks, then
        what the final cache still holds (the last, partial block too)."""
        held, end = _held(final)
        out: list[KVBlock] = []
        for n, (start, stop) in enumerate(spans):
            part = captures.windows.get(start) if stop - start == self.block else None
            if part is None:
                if start < end - held or stop > end:
                    break
                rest = spans[n:]
                if rest[-1][1] > end:
                    break
                keys, values = _window_arrays(final, held)
                return out + self.kv.cut_arrays(keys, values, rest, end - held)
            out.append(part)
        return out

    def join(self, blocks: list[Block], n: int, state: State | None = None) -> list[Any]:
        """A private one-row cache of the first ``n`` positions: the blocks' KV and the state at ``n``."""
        out: list[Any] = [None] * len(self.cache_layout.layers)
        if self.attention:
            k, v = self.kv.join_arrays([b.attention for b in blocks if b.attention is not None], n)
            for j, i in enumerate(self.attention):
                kv = KVCache()
                kv.keys, kv.values, kv.offset = k[j : j + 1], v[j : j + 1], n
                out[i] = kv
        if self.windows:
            self._join_windows(blocks, n, out)
        for j, i in enumerate(self.states):
            arrays = ArraysCache(self.cache_layout.layers[i].arrays)
            if state is not None:
                arrays.cache = cast(Any, [mx.contiguous(a) for a in state[j]])
            out[i] = arrays
        mx.eval([a for c in out for a in _arrays(c)])
        return out

    def _join_windows(self, blocks: list[Block], n: int, out: list[Any]) -> None:
        """Each windowed layer's last ``window`` positions before ``n`` (and the ``keep`` first)."""
        block = blocks[0].tokens if blocks else 1
        widest = self.cache_layout.widest_window
        first = max(0, n - widest) // block  # the first block the widest window reaches
        parts = [b.window for b in blocks[first:] if b.window is not None]
        origin = first * block
        k, v = self.kv.join_arrays(parts, n - origin) if parts else (None, None)
        head = None
        if any(self.cache_layout.layers[i].keep for i in self.windows) and origin > 0:
            head = self.kv.join_arrays([b.window for b in blocks[:1] if b.window is not None], block)
        for j, i in enumerate(self.windows):
            spec = self.cache_layout.layers[i]
            size = spec.window or 0
            c = RotatingKVCache(size, keep=spec.keep)
            if k is not None and v is not None:
                held = min(n, size)
                keys, values = k[j : j + 1, :, n - origin - held :, :], v[j : j + 1, :, n - origin - held :, :]
                if spec.keep and n > size and head is not None:
                    tail = size - spec.keep
                    keys = mx.concatenate([head[0][j : j + 1, :, : spec.keep], keys[..., -tail:, :]], axis=2)
                    values = mx.concatenate([head[1][j : j + 1, :, : spec.keep], values[..., -tail:, :]], axis=2)
                c.keys, c.values = mx.contiguous(keys), mx.contiguous(values)
                c.offset = n
                set_written(c, keys.shape[2])
            out[i] = c

    def nbytes(self, block: Block) -> int:
        return sum(self.kv.nbytes(part) for part in (block.attention, block.window) if part is not None)

    # -- what a sequence captures on its way ----------------------------------

    def capture(self, row: list[Any], position: int, captures: Captures) -> None:
        """Take what a row's windowed and recurrent layers hold at ``position`` (``row``: their
        extracted caches, windows first): each block now whole in the windows, and the state
        when ``position`` is one of the sequence's checkpoints."""
        windows, states = row[: len(self.windows)], row[len(self.windows) :]
        if windows:
            self.capture_windows(windows, captures)
        if states and position in captures.checkpoints and position not in captures.states:
            captures.states[position] = self.state_of(states)

    def capture_windows(self, windows: list[Any], captures: Captures) -> None:
        """Cut the whole blocks all of whose positions ``windows`` (one row's windowed caches,
        in time order) hold, past ``captures.window_until``."""
        block = self.block
        held, end = _held(windows)
        first = -(-max(captures.window_until, end - held) // block) * block
        stop = end // block * block
        spans = [(s, s + block) for s in range(first, stop, block)]
        if spans:
            keys, values = _window_arrays(windows, held)
            for span, kv in zip(spans, self.kv.cut_arrays(keys, values, spans, end - held)):
                captures.windows[span[0]] = kv
        captures.window_until = max(captures.window_until, stop)

    def state_of(self, states: list[Any]) -> State:
        """A copy of recurrent layers' arrays (``states``: one row's caches of them), evaluated."""
        state = tuple(tuple(mx.contiguous(a) for a in c.cache) for c in states)
        mx.eval([a for layer in state for a in layer])
        return state

    def final_state(self, cache: list[Any]) -> State | None:
        return self.state_of([cache[i] for i in self.states]) if self.states else None

    @staticmethod
    def state_nbytes(state: State) -> int:
        return sum(a.nbytes for layer in state for a in layer)

    # -- the disk tier ------------------------------------------------------

    def to_tensors(self, block: Block) -> dict[str, Tensor]:
        out = {}
        if block.attention is not None:
            out.update(self.kv.to_tensors(block.attention))
        if block.window is not None:
            out.update(self.kv.to_tensors(block.window, "window."))
        return out

    def from_tensors(self, tensors: dict[str, Tensor], tokens: int) -> Block:
        shapes = self.shapes
        if shapes is None:
            raise ValueError("no KV layout to check a block against")
        attention = self.kv.read(tensors, tokens, shapes.attention) if shapes.attention else None
        window = self.kv.read(tensors, tokens, shapes.window, "window.") if shapes.window else None
        parts = [p for p in (attention, window) if p is not None]
        if len(tensors) != self.kv.arrays * len(parts):
            raise ValueError("arrays this block does not have")
        mx.eval([a for p in parts for a in (*p.keys, *p.values)])
        return Block(tokens, attention, window)

    def state_tensors(self, state: State) -> dict[str, Tensor]:
        return {f"state.{j}.{k}": host_tensor(a) for j, layer in enumerate(state) for k, a in enumerate(layer)}

    def state_from_tensors(self, tensors: dict[str, Tensor]) -> State:
        shapes = self.shapes
        if shapes is None:
            raise ValueError("no layout to check a checkpoint against")
        state = tuple(
            tuple(device_array(tensors.get(f"state.{j}.{k}"), f"state.{j}.{k}", d, s) for k, (d, s) in enumerate(layer))
            for j, layer in enumerate(shapes.states)
        )
        if len(tensors) != sum(len(layer) for layer in state):
            raise ValueError("arrays this checkpoint does not have")
        mx.eval([a for layer in state for a in layer])
        return state

    def probe(self, model: Any) -> LayeredShapes:
        """The shapes of ``model``'s blocks and checkpoints, from one token run through a fresh cache."""
        cache = make_prompt_cache(model)
        model(mx.array([[0]]), cache=cache)
        mx.eval([a for c in cache for a in _arrays(c)])

        def stacked(indices: tuple[int, ...]) -> KVLayout | None:
            if not indices:
                return None
            k, v = cache[indices[0]].keys, cache[indices[0]].values
            if any(cache[i].keys.shape[1:] != k.shape[1:] or cache[i].values.shape[3] != v.shape[3] for i in indices):
                raise ValueError("layers of one kind with different shapes")
            return KVLayout(len(indices), k.shape[1], k.shape[3], v.shape[3], _dtype(k.dtype))

        states = tuple(tuple((host_tensor(a).dtype, tuple(a.shape)) for a in cache[i].cache) for i in self.states)
        self.shapes = LayeredShapes(stacked(self.attention), stacked(self.windows), states)
        return self.shapes

    def state_bytes(self) -> int | None:
        """What one checkpoint holds (known once probed)."""
        if self.shapes is None:
            return None
        total = 0
        for layer in self.shapes.states:
            for dtype, shape in layer:
                count = 1
                for d in shape:
                    count *= d
                total += count * _ITEM[dtype]
        return total


_ITEM = {"F32": 4, "F16": 2, "BF16": 2, "U32": 4}


def _held(windows: list[Any]) -> tuple[int, int]:
    """How many positions each of one row's windowed caches holds (in time order, as mlx-lm
    extracts a row), and the position after the last."""
    return min(c.keys.shape[2] for c in windows), int(windows[0].offset)


def _window_arrays(windows: list[Any], held: int) -> tuple[list[mx.array], list[mx.array]]:
    return [c.keys[..., -held:, :] for c in windows], [c.values[..., -held:, :] for c in windows]


def _arrays(cache: Any) -> list[mx.array]:
    held = (
        cache.cache
        if isinstance(cache, ArraysCache)
        else (getattr(cache, "keys", None), getattr(cache, "values", None))
    )
    return [a for a in held if isinstance(a, mx.array)]


def _dtype(dtype: Any) -> str:
    for name in ("float32", "float16", "bfloat16"):
        if getattr(mx, name) == dtype:
            return name
    raise ValueError(f"KV of dtype {dtype} is not held in blocks")
