"""Which prefix cache an engine gets, settled at load from the model's layout: blocks (and their
disk tier) of attention KV, of a layered model's KV and checkpoints, or whole sequences."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ...log import log_event
from ...store.layout import hub_snapshot
from ..batch.layout import CacheLayout, read_layout
from ..options import EngineOptions
from .block_cache import BLOCK_TOKENS, BlockCache
from .block_disk import DiskStore
from .block_file import VERSION
from .fingerprint import cache_fingerprint, weights_fingerprint
from .kv import BlockKV, MLXKVOps, probe_layout
from .layered_kv import LayeredKV
from .prefix_cache import EntryCache, PromptCache

logger = logging.getLogger("vllmmlxd.engine")


def make_prefix_cache(
    model: Any,
    options: EngineOptions,
    *,
    distributed: bool = False,
    weights: Path | str | None = None,
    layout: CacheLayout | None = None,
) -> PromptCache:
    """The engine's prefix cache: blocks when the entry asks for them and the model's layers can
    be held in blocks (``CacheLayout.prefix_cache``), else whole sequences. ``weights``: the
    model's folder (or hub repo id), which keys the disk tier; a sharded entry's ranks each hold
    a share of the KV and have none."""
    budget = options.cache_budget_bytes
    layout = layout or read_layout(model, probe=False)  # the cache needs no drift (and a sharded rank cannot probe)
    ops = make_kv_ops(model, options, layout, distributed=distributed)
    if isinstance(ops, MLXKVOps):
        if options.paged_cache and budget:
            log_event(logger, "cache.whole_sequences", reason=_whole_why(layout, distributed))
        return EntryCache(budget, ops)
    if options.cache_disk_dir is None or budget == 0:
        return BlockCache(budget, ops, kv_bits=options.kv_bits)
    why = "a sharded entry's ranks each hold a share of the KV" if distributed else None
    disk = None
    try:
        disk = None if why else _open_disk(model, ops, options, weights)
    except OSError as exc:  # the cache is an optimisation: a bad directory costs the tier, not the worker
        why = f"cannot use {options.cache_disk_dir}: {exc}"
    if disk is None:
        why = why or "the model's weights or KV layout cannot be fingerprinted"
        log_event(logger, "cache.disk_off", logging.WARNING, reason=why)
    else:
        log_event(logger, "cache.disk", dir=str(disk.dir), budget_gb=round(disk.budget_bytes / 1024**3, 2))
    cache = BlockCache(budget, ops, disk=disk, kv_bits=options.kv_bits)
    cache.disk_off = why
    return cache


def make_kv_ops(
    model: Any, options: EngineOptions, layout: CacheLayout | None = None, *, distributed: bool = False
) -> BlockKV | LayeredKV | MLXKVOps:
    """The KV operations of the engine's prefix cache: blocks (plain attention KV, paged cache on;
    a layered model's, except on a sharded entry) or whole sequences. A sharded entry's other
    ranks cut and join the same pieces with them."""
    layout = layout or read_layout(model, probe=False)  # the cache needs no drift (and a sharded rank cannot probe)
    kind = layout.prefix_cache(BLOCK_TOKENS) if options.paged_cache else "sequences"
    if kind == "blocks":
        return BlockKV(options.kv_bits, options.kv_group_size)
    if kind != "sequences" and not distributed:
        return LayeredKV(layout, BLOCK_TOKENS, options.kv_bits, options.kv_group_size)
    return MLXKVOps()


def _whole_why(layout: CacheLayout, distributed: bool) -> str:
    if layout.prefix_cache(BLOCK_TOKENS) != "sequences":
        return "a sharded entry's windowed or recurrent layers are not held in blocks"
    opaque = ", ".join(layout.describe()["opaque"]) or "a window no longer than a block"
    return f"the model's layers hold what blocks cannot ({opaque})"


def _open_disk(
    model: Any, ops: BlockKV | LayeredKV, options: EngineOptions, weights: Path | str | None
) -> DiskStore | None:
    folder = _weights_folder(weights)
    if folder is None or options.cache_disk_dir is None:
        return None
    facts: dict[str, Any]
    if isinstance(ops, LayeredKV):
        # Blocks and checkpoints read back are checked against these shapes.
        facts = {"layered": ops.cache_layout.describe(), **ops.probe(model).describe()}
    else:
        layout = probe_layout(model)
        if layout is None:
            return None
        ops.layout = layout  # blocks read back are checked against it
        facts = layout.describe()
    fingerprint = cache_fingerprint(
        weights_fingerprint(folder),
        {
            **facts,
            "kv_bits": options.kv_bits,
            "kv_group_size": options.kv_group_size if options.kv_bits else None,
            "block_tokens": BLOCK_TOKENS,
            "format": VERSION,
        },
    )
    return DiskStore(options.cache_disk_dir, fingerprint, options.cache_disk_budget_bytes)


def _weights_folder(weights: Path | str | None) -> Path | None:
    if weights is None:
        return None
    folder = Path(weights)
    if folder.is_dir():
        return folder
    return hub_snapshot(str(weights)) if isinstance(weights, str) and weights.count("/") == 1 else None
