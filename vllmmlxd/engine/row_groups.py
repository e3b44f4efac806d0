"""A batch whose rows keep their KV in groups, so a prompt joins without copying anyone's KV.

mlx-lm's ``BatchKVCache`` holds every row in one left-padded array: when a prefilled prompt
joins, ``extend`` pads both the running rows and the new one to the longest and concatenates
them (on a CPU, half a second for a 2,000-token prompt beside a short stream: every running
stream stalls that long), and from then on a short row attends over the long one's padding.
Here each layer's cache is a list of groups, each an ordinary ``BatchKVCache`` of some rows: a
joining batch becomes a group of its own, a finished row's group is dropped, and only a batch
with more than ``MAX_GROUPS`` groups merges two small neighbours (a cheap copy).

The forward pass still reads the weights once a step: every row goes through the projections,
the feed-forward block and the output head together; only attention runs group by group, each
with its own offsets and mask. That needs the layer written out, so it is done for the decoder
families whose layers are the plain pre-norm kind (llama, mistral, qwen2, qwen3); any other
model keeps mlx-lm's single array (``groupable``).
"""

from __future__ import annotations

from typing import Any, Iterator

import mlx.core as mx
from mlx_lm.generate import GenerationBatch
from mlx_lm.models.base import create_attention_mask, scaled_dot_product_attention
from mlx_lm.models.cache import BatchKVCache, KVCache

MAX_GROUPS = 4  # attention runs once a group a layer: past this many, two small neighbours merge
FAMILIES = ("mlx_lm.models.llama", "mlx_lm.models.mistral", "mlx_lm.models.qwen2", "mlx_lm.models.qwen3")
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj", "rope", "n_heads", "n_kv_heads", "scale")
BLOCK = ("self_attn", "mlp", "input_layernorm", "post_attention_layernorm")


def groupable(model: Any) -> bool:
    """Whether ``model`` is a decoder this module can run group by group: one of ``FAMILIES``,
    every layer full attention of the plain pre-norm kind."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if type(model).__module__ not in FAMILIES or not layers or getattr(inner, "swa_idx", None) is not None:
        return False
    if not hasattr(inner, "embed_tokens") or not hasattr(inner, "norm") or not hasattr(model, "args"):
        return False
    return all(
        all(hasattr(layer, a) for a in BLOCK) and all(hasattr(layer.self_attn, a) for a in ATTENTION)
        for layer in layers
    )


def rows_of(cache: BatchKVCache) -> int:
    return int(cache.offset.shape[0])


class GroupedKV:
    """One layer's KV for the batch: its rows, in order, split over ``groups``."""

    def __init__(self, groups: list[BatchKVCache]):
        self.groups = groups

    def spans(self) -> list[tuple[int, int]]:
        """Each group's rows as [start, end) of the batch."""
        out, start = [], 0
        for g in self.groups:
            out.append((start, start + rows_of(g)))
            start += rows_of(g)
        return out

    def extend(self, other: Any) -> None:
        self.groups.extend(other.groups if isinstance(other, GroupedKV) else [other])

    def filter(self, keep: list[int]) -> None:
        """Keep the rows ``keep`` (in that order); a group none of whose rows stay is dropped
        without a copy, and one whose rows all stay is left as it is."""
        if any(b <= a for a, b in zip(keep, keep[1:])):  # not in batch order: one array, as mlx-lm would
            self.merge(0, len(self.groups))
            self.groups[0].filter(keep)
            return
        kept = []
        for g, (start, end) in zip(self.groups, self.spans()):
            local = [i - start for i in keep if start <= i < end]
            if not local:
                continue
            if len(local) < end - start:
                g.filter(local)
            kept.append(g)
        self.groups = kept

    def merge(self, first: int, stop: int) -> None:
        """Groups ``first`` to ``stop`` (exclusive) become one (mlx-lm's padded copy)."""
        merged = self.groups[first]
        for g in self.groups[first + 1 : stop]:
            merged.extend(g)
        self.groups[first:stop] = [merged]

    def locate(self, idx: int) -> tuple[BatchKVCache, int]:
        for g, (start, end) in zip(self.groups, self.spans()):
            if start <= idx < end:
                return g, idx - start
        raise IndexError(idx)

    def extract(self, idx: int) -> KVCache:
        """Row ``idx``'s KV as a cache of its own. A row alone in its group is a view of that
        group's buffer (its group is about to be dropped): no copy."""
        g, local = self.locate(idx)
        if rows_of(g) > 1 or g.keys is None:
            return g.extract(local)
        start = int(g.left_padding[0].item())
        cache = KVCache()
        cache.keys = g.keys[..., start : g._idx, :]
        cache.values = g.values[..., start : g._idx, :]
        cache.offset = g._idx - start
        return cache

    def trim(self, n: int) -> int:
        return min(g.trim(n) for g in self.groups)

    def is_trimmable(self) -> bool:
        return True

    def size(self) -> int:
        return max((g.size() for g in self.groups), default=0)

    def empty(self) -> bool:
        return all(g.empty() for g in self.groups)

    @property
    def nbytes(self) -> int:
        return sum(g.nbytes for g in self.groups)

    @property
    def state(self) -> list[Any]:
        return [g.state for g in self.groups]


def row_groups(cache: Any) -> Iterator[tuple[BatchKVCache, slice]]:
    """Each ``BatchKVCache`` of one layer's cache with the batch rows it holds."""
    if isinstance(cache, GroupedKV):
        for g, (start, end) in zip(cache.groups, cache.spans()):
            yield g, slice(start, end)
    else:
        yield cache, slice(0, rows_of(cache))


class GroupedModel:
    """The model as the batch calls it: over grouped caches, attention group by group."""

    def __init__(self, model: Any):
        self.model = model

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def __call__(self, inputs: mx.array, cache: list[Any] | None = None, **kwargs: Any) -> mx.array:
        if not cache or not isinstance(cache[0], GroupedKV):
            return self.model(inputs, cache=cache, **kwargs)
        if len(cache[0].groups) == 1:
            return self.model(inputs, cache=[c.groups[0] for c in cache], **kwargs)
        return grouped_forward(self.model, inputs, cache)


def grouped_forward(model: Any, inputs: mx.array, cache: list[GroupedKV]) -> mx.array:
    """The logits of ``inputs`` (rows in batch order), each group attending to its own KV."""
    inner = model.model
    h = inner.embed_tokens(inputs)
    spans = cache[0].spans()
    # The masks are read before any layer writes: they are the same for every layer.
    masks = [create_attention_mask(h[a:b], g) for g, (a, b) in zip(cache[0].groups, spans)]
    for layer, layer_cache in zip(inner.layers, cache):
        h = h + _attention(layer.self_attn, layer.input_layernorm(h), layer_cache.groups, spans, masks)
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    out = inner.norm(h)
    if getattr(model.args, "tie_word_embeddings", False) or not hasattr(model, "lm_head"):
        return inner.embed_tokens.as_linear(out)
    return model.lm_head(out)


def _attention(
    attn: Any, x: mx.array, groups: list[BatchKVCache], spans: list[tuple[int, int]], masks: list[Any]
) -> mx.array:
    B, L, _ = x.shape
    queries = attn.q_proj(x).reshape(B, L, attn.n_heads, -1)
    keys = attn.k_proj(x).reshape(B, L, attn.n_kv_heads, -1)
    if hasattr(attn, "q_norm"):  # qwen3 normalises each head
        queries, keys = attn.q_norm(queries), attn.k_norm(keys)
    queries, keys = queries.transpose(0, 2, 1, 3), keys.transpose(0, 2, 1, 3)
    values = attn.v_proj(x).reshape(B, L, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
    outs = []
    for g, (a, b), mask in zip(groups, spans, masks):
        q = attn.rope(queries[a:b], offset=g.offset)
        k, v = g.update_and_fetch(attn.rope(keys[a:b], offset=g.offset), values[a:b])
        outs.append(scaled_dot_product_attention(q, k, v, cache=g, scale=attn.scale, mask=mask))
    out = mx.concatenate(outs, axis=0) if len(outs) > 1 else outs[0]
    return attn.o_proj(out.transpose(0, 2, 1, 3).reshape(B, L, -1))


class GroupedBatch(GenerationBatch):
    """mlx-lm's generation batch, whose rows joining later keep their KV apart (``GroupedKV``)."""

    grouping: bool = False  # set by the scheduler: the model is ``groupable`` and wrapped in ``GroupedModel``

    def extend(self, batch: Any) -> None:
        joins = bool(self.prompt_cache) and bool(batch.prompt_cache)
        grouped = (
            self.grouping
            and joins
            and all(type(c) is BatchKVCache or isinstance(c, GroupedKV) for c in self.prompt_cache)
            and all(type(c) is BatchKVCache for c in batch.prompt_cache)
        )
        if grouped:
            self.prompt_cache = [c if isinstance(c, GroupedKV) else GroupedKV([c]) for c in self.prompt_cache]
        super().extend(batch)
        if grouped:
            while len(self.prompt_cache[0].groups) > MAX_GROUPS:
                first = _cheapest_merge(self.prompt_cache[0].groups)
                for c in self.prompt_cache:
                    c.merge(first, first + 2)


def _cheapest_merge(groups: list[BatchKVCache]) -> int:
    """The first of the two neighbouring groups whose merged array is smallest (rows x positions)."""
    cost = [(rows_of(a) + rows_of(b)) * max(a.size(), b.size()) for a, b in zip(groups, groups[1:])]
    return cost.index(min(cost))
