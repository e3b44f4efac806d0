"""A recurrent model's checkpoints in the block cache (engine/cache/block_cache.py with a layered
model's ops): a lookup continues from the deepest checkpoint within what it shares, states
are kept on the blocks they end, and over budget the checkpoints of inner blocks go before the
blocks and a conversation's last state."""

from __future__ import annotations

from typing import Any, cast

from vllmmlxd.engine.batch.layout import CacheLayout, LayerCache
from vllmmlxd.engine.cache.block_cache import BlockCache
from vllmmlxd.engine.cache.checkpoints import Captures


class LayeredOps:
    """Blocks and states as labels: a block is (start, end), a state ("state", position)."""

    # What the block cache tells a layered model's ops by (and /v1/status names).
    cache_layout = CacheLayout("x", (LayerCache("attention"), LayerCache("state", arrays=1)))
    states = (0,)

    def blockable(self, cache):
        return True

    def positions(self, cache):
        return cache["n"]

    def cut(self, cache, spans, captures=None):
        return list(spans)

    def join(self, blocks, n, state=None):
        return {"blocks": blocks, "n": n, "state": state}

    def nbytes(self, block):
        return 10

    def final_state(self, cache):
        return ("state", cache["n"])

    @staticmethod
    def state_nbytes(state):
        return 100

    def state_bytes(self):
        return 100


def stored(budget: int = 10_000) -> BlockCache:
    cache = BlockCache(budget, cast(Any, LayeredOps()), block_tokens=4)  # a stand-in: the ops it calls
    captures = Captures(states={4: ("state", 4), 8: ("state", 8), 12: ("state", 12)})
    cache.insert(list(range(16)), cast(Any, {"n": 16}), captures=captures)
    return cache


def test_a_lookup_continues_from_the_deepest_checkpoint_it_shares():
    cache = stored()
    assert cache.tree.states == 4 and cache.nbytes == 4 * 10 + 4 * 100
    hit = cache.lookup([*list(range(16)), 99])  # all of it: the sequence's own last state
    assert (hit.cached_tokens, hit.cache["state"], hit.shared) == (16, ("state", 16), 16)
    hit = cache.lookup([*list(range(11)), 99])
    assert (hit.cached_tokens, hit.cache["state"], hit.shared) == (8, ("state", 8), 11)
    assert cache.lookup([5, 6, 7]).cached_tokens == 0


def test_over_budget_inner_checkpoints_go_first_and_the_blocks_and_last_state_stay():
    cache = stored(budget=4 * 10 + 2 * 100)
    assert cache.tree.states == 2 and len(cache) == 4 and cache.state_evictions == 2
    assert cache.lookup([*list(range(16)), 99]).cached_tokens == 16  # the last state stayed
    assert cache.lookup([*list(range(13)), 99]).cached_tokens == 12  # the newest inner one too
    assert cache.lookup([*list(range(9)), 99]).cached_tokens == 0  # an older one went
    assert cache.describe()["checkpoint_evictions"] == 2
