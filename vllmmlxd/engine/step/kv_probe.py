"""A model's KV layout, read from the cache it really makes (engine thread or load time; mlx).

One token's forward pass is built on a fresh ``make_prompt_cache`` and never evaluated: MLX
knows every array's shape and type before it computes anything, so the caches' buffers tell
the bytes a token costs in each layer (whatever the family: grouped heads, a latent KV, a
quantized cache) without running the model, and without a sharded model's collectives.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import CacheList, make_prompt_cache

from ...log import log_event
from ..batch.layout import CacheLayout
from ..options import EngineOptions
from .kv_budget import GROWTH_STEP, KvBudget, KvLayout, LayerKv

logger = logging.getLogger("vllmmlxd.engine")


def probe_layout(model: Any) -> KvLayout:
    """The KV layout of ``model``'s sequences (raises what the model raises)."""
    cache = make_prompt_cache(model)
    model(mx.array([[0]]), cache=cache)  # a graph only: nothing is evaluated
    return KvLayout(tuple(_layer(c) for c in cache))


def _layer(cache: Any) -> LayerKv:
    if isinstance(cache, CacheList):
        parts = [_layer(c) for c in cache.caches]
        caps = {p.cap for p in parts if p.per_token}
        return LayerKv(
            sum(p.per_token for p in parts), caps.pop() if len(caps) == 1 else None, sum(p.fixed for p in parts)
        )
    keys = getattr(cache, "keys", None)
    if keys is not None:
        arrays = _arrays((keys, getattr(cache, "values", None)))
        positions = arrays[0].shape[2]  # (batch, heads, positions, dim): positions allocated so far
        per_token = -(-sum(a.nbytes for a in arrays) // positions)
        # A sliding window (RotatingKVCache) or a chunked attention keeps that many tokens at most.
        cap = getattr(cache, "max_size", None) or getattr(cache, "chunk_size", None)
        return LayerKv(per_token, cap)
    if hasattr(cache, "keys"):  # a layer this rank does not run (a pipeline's other stages)
        return LayerKv(0)
    # A recurrent layer's state (ArraysCache): the same size at any length.
    return LayerKv(0, fixed=sum(a.nbytes for a in _arrays(getattr(cache, "state", ()))))


def _arrays(value: Any) -> list[mx.array]:
    if isinstance(value, mx.array):
        return [value]
    if isinstance(value, (list, tuple)):
        return [a for v in value for a in _arrays(v)]
    return []


def entry_budget(
    model: Any, options: EngineOptions, layout: CacheLayout, layered: Any, *, drafting: bool, draft: Any
) -> KvBudget:
    """The model's KV layout (and its draft model's, which keeps a cache a row), and the entry's
    explicit limit; no limit when the layout cannot be read. ``drafting``: the batch speculates."""
    try:
        kv: KvLayout | None = _captured(probe_layout(model).layers, layout, layered)
        if drafting and draft is not None:
            assert kv is not None
            kv = replace(kv, layers=kv.layers + probe_layout(draft).layers)
    except Exception as exc:  # a family whose cache cannot be made outside a batch: admitted by count only
        log_event(logger, "kv.layout_unknown", logging.WARNING, error=repr(exc))
        kv = None
    # A verify step writes every draft position before it trims the rejected ones.
    slack = GROWTH_STEP + (options.speculative.num_draft if drafting and options.speculative else 0)
    budget = KvBudget(kv, slack=slack)
    if options.kv_budget_bytes is not None:
        budget = budget.with_limit(options.kv_budget_bytes, options.kv_budget_source)
    return budget


def _captured(layers: tuple[LayerKv, ...], layout: CacheLayout, layered: Any) -> KvLayout:
    """``layers``, and what a layered model's prompt holds on its way into the prefix cache
    (``checkpoints.Captures``): each windowed layer's KV of every position, and the recurrent
    state's checkpoints."""
    if layered is None or len(layers) != len(layout.layers):
        return KvLayout(layers)
    kinds = [spec.kind for spec in layout.layers]
    windows = tuple(LayerKv(layer.per_token) for layer, kind in zip(layers, kinds) if kind == "window")
    state = sum(layer.fixed for layer, kind in zip(layers, kinds) if kind == "state")
    return KvLayout(layers + windows, checkpoint_bytes=state, block=layered.block)
