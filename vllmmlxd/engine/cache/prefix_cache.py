"""The prefix cache's shared terms, and its whole-entry variant for KV that cannot be cut into blocks.

Two caches answer the scheduler through one interface (``PromptCache``): the block cache
(``block_cache.py``: plain attention KV in fixed-size token blocks in a prefix tree, shared
between conversations, with a disk tier) and ``EntryCache`` here, which stores each sequence's
KV whole: the path for caches that cannot be split by position (mlx-lm's RotatingKVCache, an
SSM's ArraysCache, anything not trimmable), and what ``use_paged_cache: false`` asks for.

A lookup answers the longest cached start of a prompt: an *exact* hit (the same tokens), a
*prefix* hit (a stored sequence is a start of the prompt: a resent chat history) or an *lcp*
hit (the two share a longest common prefix, cut back to it). The caller gets its own copy of
just that prefix, so nothing a running request uses is ever evicted; stored KV is evicted least
recently used first, until the real bytes of the stored arrays fit the budget.

Pure bookkeeping: the KV operations come from ``cache/kv.py`` and are replaced in unit tests.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np

HitType = Literal["exact", "prefix", "lcp", "none"]
# One piece of KV a cache kept from a sequence: (id, first position, end position). A sharded
# entry's other ranks cut the same pieces from their own share of the sequence (engine/batch/batch.py: Mirror).
Piece = tuple[int, int, int]
# Whole entries at most: a lookup or insert scans them all (1.7 ms at 1,000 on the engine thread),
# so this bounds what the whole-entry cache costs a request; the block cache does not scan.
MAX_ENTRIES = 1024


class KVOps(Protocol):
    def copy_prefix(self, cache: list[Any], n: int) -> list[Any]:
        """A compact copy of the first ``n`` positions of a per-layer cache list."""
        ...

    def adopt(self, cache: list[Any], n: int) -> list[Any]:
        """``cache`` itself when it is already a compact private copy of ``n`` positions, else a copy."""
        ...

    def nbytes(self, cache: list[Any]) -> int: ...

    def trimmable(self, cache: list[Any]) -> bool:
        """Whether the cache can be cut back to a shorter prefix (attention KV can; SSM state cannot)."""
        ...


@dataclass(frozen=True)
class CacheHit:
    cache: list[Any] | None  # a private copy to continue from, or None on a miss
    cached_tokens: int
    hit_type: HitType
    source: tuple[int, ...] = ()  # the ids of the entry or blocks it was copied from, in order
    # Tokens the prompt shares with what is stored, where that is more than it could continue
    # from (a recurrent model continues from a checkpoint only): where to checkpoint this time.
    shared: int = 0


@dataclass
class CacheStats:
    lookups: int = 0
    hits: int = 0
    cached_tokens: int = 0
    inserts: int = 0
    evictions: int = 0
    too_large: int = 0  # sequences bigger than the whole budget, never stored

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0


class PromptCache(Protocol):
    """What the scheduler asks of a prefix cache (``EntryCache`` or ``block_cache.BlockCache``)."""

    budget_bytes: int
    stats: CacheStats
    on_drop: Callable[[int], None]

    @property
    def enabled(self) -> bool: ...

    @property
    def nbytes(self) -> int: ...

    def __len__(self) -> int: ...

    def lookup(self, tokens: list[int]) -> CacheHit: ...

    def insert(self, tokens: list[int], cache: list[Any], *, owned: bool = False) -> list[Piece] | None: ...

    def begin_step(self) -> None: ...

    def clear(self) -> None: ...

    def close(self) -> None: ...

    def describe(self) -> dict: ...


@dataclass
class _Entry:
    tokens: np.ndarray
    cache: list[Any]
    nbytes: int
    trimmable: bool
    used: int  # a tick of the LRU clock


@dataclass
class EntryCache:
    """Whole sequences' KV, one compact private copy each; every operation scans the entries."""

    budget_bytes: int
    ops: KVOps
    max_entries: int = MAX_ENTRIES
    stats: CacheStats = field(default_factory=CacheStats)

    def __post_init__(self) -> None:
        self._entries: dict[int, _Entry] = {}
        self._ids = itertools.count(1)  # an entry's id is never 0: insert's result reads as a bool too
        # Told of each entry that leaves (evicted, redundant, cleared): a sharded entry's other
        # ranks drop their copy of it (engine/distributed/lockstep.py).
        self.on_drop: Callable[[int], None] = lambda entry: None
        self._clock = itertools.count()
        self.nbytes = 0
        self.tokens = 0

    @property
    def enabled(self) -> bool:
        return self.budget_bytes > 0

    def __len__(self) -> int:
        return len(self._entries)

    def begin_step(self) -> None:
        """Nothing to pin: a hit is a private copy, and an entry is evicted whole."""

    def close(self) -> None:
        """Nothing runs beside it."""

    def lookup(self, tokens: list[int]) -> CacheHit:
        """The longest cached start of ``tokens`` (at most all but the last token, which must be fed)."""
        if not self.enabled:
            return CacheHit(None, 0, "none")
        self.stats.lookups += 1
        best: tuple[int, int, HitType] | None = None  # (usable, entry id, type)
        query = np.asarray(tokens, dtype=np.int64)
        for key, entry in self._entries.items():
            shared = common_prefix(entry.tokens, query)
            usable = min(shared, len(query) - 1)
            if usable <= 0:
                continue
            if shared == len(entry.tokens) == len(query):
                kind: HitType = "exact"
            elif shared == len(entry.tokens):
                kind = "prefix"
            else:
                kind = "lcp"
            if usable < len(entry.tokens) and not entry.trimmable:
                continue  # a recurrent state cannot be cut back
            if best is None or usable > best[0]:
                best = (usable, key, kind)
        if best is None:
            return CacheHit(None, 0, "none")
        usable, key, kind = best
        entry = self._entries[key]
        entry.used = next(self._clock)
        self.stats.hits += 1
        self.stats.cached_tokens += usable
        return CacheHit(self.ops.copy_prefix(entry.cache, usable), usable, kind, (key,))

    def insert(self, tokens: list[int], cache: list[Any], *, owned: bool = False) -> list[Piece] | None:
        """Store the KV of ``tokens``; returns the new entry as its one piece, or None when it is not kept.

        The cache is copied, unless ``owned`` says it is a fresh extraction nobody else holds.
        """
        if not self.enabled or not tokens:
            return None
        trimmable = self.ops.trimmable(cache)
        query = np.asarray(tokens, dtype=np.int64)
        for entry in self._entries.values():
            # Already covered: a stored entry that starts with these tokens serves them too.
            longer_ok = entry.trimmable or len(entry.tokens) == len(query)
            if len(entry.tokens) >= len(query) and longer_ok and common_prefix(entry.tokens, query) == len(query):
                entry.used = next(self._clock)
                return None
        stored = self.ops.adopt(cache, len(tokens)) if owned else self.ops.copy_prefix(cache, len(tokens))
        size = self.ops.nbytes(stored)
        if size > self.budget_bytes:
            self.stats.too_large += 1
            return None
        if trimmable:  # entries that are starts of this one are now redundant
            for key in [
                k
                for k, e in self._entries.items()
                if len(e.tokens) < len(query) and common_prefix(e.tokens, query) == len(e.tokens)
            ]:
                self._drop(key)
        key = next(self._ids)
        self._entries[key] = _Entry(query, stored, size, trimmable, next(self._clock))
        self.nbytes += size
        self.tokens += len(query)
        self.stats.inserts += 1
        self._evict()
        return [(key, 0, len(query))] if key in self._entries else None

    def clear(self) -> None:
        for key in list(self._entries):
            self._drop(key)

    def _evict(self) -> None:
        while (self.nbytes > self.budget_bytes or len(self._entries) > self.max_entries) and self._entries:
            self._drop(min(self._entries, key=lambda k: self._entries[k].used))
            self.stats.evictions += 1

    def _drop(self, key: int) -> None:
        entry = self._entries.pop(key)
        self.nbytes -= entry.nbytes
        self.tokens -= len(entry.tokens)
        self.on_drop(key)

    def describe(self) -> dict:
        """The ``cache`` block of /v1/status."""
        return {
            "type": "prefix_lru",
            "entries": len(self._entries),
            "max_entries": self.max_entries,
            "tokens": self.tokens,
            "kv_bytes_per_token": round(self.nbytes / self.tokens, 1) if self.tokens else None,
            "kv_bits": None,
            "hit_rate": round(self.stats.hit_rate, 3),
            "memory_mb": round(self.nbytes / 1024**2, 3),
            "memory_bytes": self.nbytes,
            "budget_mb": round(self.budget_bytes / 1024**2, 1),
            "hits": self.stats.hits,
            "misses": self.stats.lookups - self.stats.hits,
            "cached_tokens": self.stats.cached_tokens,
            "evictions": self.stats.evictions,
            "disk": None,
        }


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens two sequences share."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n
