"""prefix_cache.py's EntryCache (whole sequences): which entry a prompt reuses, the byte budget and
the entry cap, with fake KV objects.

The KV operations are stand-ins (a cache is a list of token ids and its size is 10 bytes a
token), so these tests are about the bookkeeping; tests/integration runs the real thing.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from vllmmlxd.engine.cache.prefix_cache import EntryCache, common_prefix

BYTES_PER_TOKEN = 10


class FakeKV:
    """A 'cache' is the list of tokens it holds; copies are real copies, trimmable unless told."""

    def __init__(self, trimmable: bool = True):
        self._trimmable = trimmable
        self.copies = 0

    def copy_prefix(self, cache, n):
        self.copies += 1
        return [list(cache[0][:n])]

    def adopt(self, cache, n):
        return cache if len(cache[0]) == n else self.copy_prefix(cache, n)

    def nbytes(self, cache):
        return len(cache[0]) * BYTES_PER_TOKEN

    def trimmable(self, cache):
        return self._trimmable


def kv(tokens):
    return [list(tokens)]


def make(budget_tokens=1000, trimmable=True):
    return EntryCache(budget_tokens * BYTES_PER_TOKEN, FakeKV(trimmable))


def test_a_miss_then_an_exact_hit_keeps_the_last_token_to_feed():
    cache = make()
    assert cache.lookup([1, 2, 3]).hit_type == "none"
    cache.insert([1, 2, 3], kv([1, 2, 3]))
    hit = cache.lookup([1, 2, 3])
    assert (hit.hit_type, hit.cached_tokens, hit.cache) == ("exact", 2, [[1, 2]])


def test_a_resent_history_is_a_prefix_hit():
    cache = make()
    history = list(range(100, 150))
    cache.insert(history, kv(history))
    hit = cache.lookup([*history, 7, 8, 9])
    assert hit.hit_type == "prefix" and hit.cached_tokens == 50 and hit.cache == [history]


def test_a_diverging_prompt_is_a_longest_common_prefix_hit():
    cache = make()
    cache.insert([1, 2, 3, 4, 5, 6], kv([1, 2, 3, 4, 5, 6]))
    hit = cache.lookup([1, 2, 3, 9, 9])
    assert hit.hit_type == "lcp" and hit.cached_tokens == 3 and hit.cache == [[1, 2, 3]]


def test_the_longest_usable_entry_wins():
    cache = make()
    cache.insert([1, 2], kv([1, 2]))
    cache.insert([5, 6, 7, 8], kv([5, 6, 7, 8]))
    cache.insert([1, 2, 3, 4, 9], kv([1, 2, 3, 4, 9]))
    assert cache.lookup([1, 2, 3, 4, 5]).cached_tokens == 4


def test_recurrent_state_cannot_be_cut_back_so_only_whole_entries_serve():
    cache = make(trimmable=False)
    cache.insert([1, 2, 3, 4], kv([1, 2, 3, 4]))
    assert cache.lookup([1, 2, 9]).hit_type == "none"
    assert cache.lookup([1, 2, 3, 4]).hit_type == "none"  # would need cutting off the last token
    assert cache.lookup([1, 2, 3, 4, 5]).hit_type == "prefix"


def test_an_entry_that_starts_a_new_one_is_dropped_and_a_covered_one_is_not_stored():
    cache = make()
    cache.insert([1, 2, 3], kv([1, 2, 3]))
    cache.insert([1, 2, 3, 4, 5], kv([1, 2, 3, 4, 5]))
    assert len(cache) == 1 and cache.nbytes == 5 * BYTES_PER_TOKEN
    assert cache.insert([1, 2, 3], kv([1, 2, 3])) is None  # already covered by the longer one
    assert len(cache) == 1


def test_least_recently_used_entries_go_first():
    cache = make(budget_tokens=10)
    cache.insert([1] * 4, kv([1] * 4))
    cache.insert([2] * 4, kv([2] * 4))
    cache.lookup([1] * 4 + [0])  # touch the first
    cache.insert([3] * 4, kv([3] * 4))  # 12 tokens > 10: evict the least recently used, the second
    assert cache.lookup([2] * 4 + [0]).hit_type == "none"
    assert cache.lookup([1] * 4 + [0]).hit_type == "prefix"
    assert cache.stats.evictions == 1


def test_the_number_of_entries_is_capped_too():
    cache = EntryCache(10**9, FakeKV(), max_entries=3)
    for i in range(5):
        assert cache.insert([i, i], kv([i, i])) is not None
    assert len(cache) == 3 and cache.stats.evictions == 2
    assert cache.lookup([0, 0, 9]).hit_type == "none" and cache.lookup([4, 4, 9]).hit_type == "prefix"


def test_an_entry_larger_than_the_whole_budget_is_never_stored():
    cache = make(budget_tokens=5)
    assert cache.insert(list(range(6)), kv(range(6))) is None
    assert len(cache) == 0 and cache.stats.too_large == 1


def test_a_zero_budget_disables_the_cache():
    cache = make(budget_tokens=0)
    assert not cache.enabled
    assert cache.insert([1, 2], kv([1, 2])) is None
    assert cache.lookup([1, 2, 3]).hit_type == "none" and cache.stats.lookups == 0


def test_stored_entries_are_private_copies():
    cache = make()
    source = kv([1, 2, 3])
    cache.insert([1, 2, 3], source)
    source[0].append(99)
    hit = cache.lookup([1, 2, 3, 4])
    assert hit.cache == [[1, 2, 3]]
    hit.cache[0].append(42)
    assert cache.lookup([1, 2, 3, 4]).cache == [[1, 2, 3]]


def test_an_owned_cache_is_kept_without_a_copy():
    cache, ops = make(), None
    ops = cache.ops
    source = kv([1, 2, 3])
    cache.insert([1, 2, 3], source, owned=True)
    assert ops.copies == 0 and cache._entries[next(iter(cache._entries))].cache is source


def test_describe_reports_the_budget_and_hit_rate():
    cache = make(budget_tokens=1024 * 1024 // BYTES_PER_TOKEN)
    cache.insert([1, 2, 3], kv([1, 2, 3]))
    cache.lookup([1, 2, 3, 4])
    cache.lookup([9, 9])
    d = cache.describe()
    assert d["entries"] == 1 and d["hit_rate"] == 0.5 and d["hits"] == 1 and d["misses"] == 1
    assert d["budget_mb"] == 1.0 and d["type"] == "prefix_lru"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=30), min_size=1, max_size=40), st.integers(1, 60))
def test_the_budget_holds_after_every_insert_and_hits_are_true_prefixes(prompts, budget_tokens):
    cache = make(budget_tokens=budget_tokens)
    for prompt in prompts:
        hit = cache.lookup(prompt)
        if hit.cache is not None:
            assert hit.cache[0] == prompt[: hit.cached_tokens] and hit.cached_tokens < len(prompt)
        cache.insert(prompt, kv(prompt))
        assert cache.nbytes <= cache.budget_bytes
        assert cache.nbytes == sum(len(e.tokens) for e in cache._entries.values()) * BYTES_PER_TOKEN


def test_common_prefix():
    a = np.array([1, 2, 3, 4])
    assert common_prefix(a, np.array([1, 2, 9])) == 2
    assert common_prefix(a, np.array([1, 2, 3, 4, 5])) == 4
    assert common_prefix(a, np.array([], dtype=np.int64)) == 0
