"""An entry's prefix cache and running KV: budgets, layout, scope, quantization, and the
``cache_disk:`` section that keeps the blocks on disk too."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import Strict


class CacheDiskConfig(Strict):
    """``cache_disk: {dir: PATH, budget_gb: 20}``; ``cache_disk: {}`` takes the defaults."""

    dir: str | None = Field(
        None, description="where the blocks are written; unset: kv-cache/ in the state directory, shared by every entry"
    )
    budget_gb: float = Field(
        20.0, gt=0, description="this model's blocks on disk at most; the least recently used are deleted first"
    )


class CacheConfig(Strict):
    """``use_paged_cache``, ``cache_memory_mb``/``cache_memory_percent``, ``cache_scope``, ``max_kv_memory_mb``,
    ``cache_disk``, ``kv_bits``, ``kv_group_size``."""

    use_paged_cache: bool = Field(
        True,
        description="the prefix cache holds KV in 32-token blocks in a prefix tree, a shared start held once; "
        "false: one copy of each whole sequence",
    )
    cache_memory_mb: int | None = Field(
        None, ge=0, description="prefix cache budget in MB (0: no cache); unset: cache_memory_percent"
    )
    cache_scope: Literal["key", "entry"] = Field(
        "key",
        description="key: each API key's prompts hit only its own prefix cache (and disk tier); entry: every key "
        "of the entry shares it, so a shared system prompt hits across keys and a key's cached_tokens can tell "
        "what another key sent",
    )
    cache_memory_percent: float = Field(
        0.20, gt=0, le=1, description="prefix cache budget as a fraction of physical memory"
    )
    max_kv_memory_mb: float | None = Field(
        None,
        gt=0,
        description="KV cache of running requests in MB at most (requests wait for room, or 400 when one never "
        "fits); unset: what the machine has left after the weights, the prefix cache and a margin",
    )
    cache_disk: CacheDiskConfig | None = Field(
        None,
        description="write the prefix cache's blocks to disk too, found again after a restart, a swap or a reboot "
        "(off by default)",
    )
    kv_bits: Literal[4, 8] | None = Field(
        None, description="the prefix cache holds KV quantized to this many bits (memory and disk); unset: as computed"
    )
    kv_group_size: Literal[32, 64, 128] = Field(64, description="kv_bits: values that share one scale and bias")


def cache_budget(entry: CacheConfig, physical_mb: int | None) -> tuple[int, str]:
    """An entry's prefix-cache budget in MB and where it comes from: cache_memory_mb, else a share of physical memory."""
    if entry.cache_memory_mb is not None:
        return entry.cache_memory_mb, "cache_memory_mb"
    if physical_mb is None:
        return 0, "cache_memory_percent of unknown memory"
    return int(physical_mb * entry.cache_memory_percent), f"{entry.cache_memory_percent * 100:g}% of physical"
