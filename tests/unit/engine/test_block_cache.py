"""block_cache.py: the prefix tree of token blocks, with fake KV (a block is the list of its tokens).

A fake "cache" is ``[tokens]``, a block the list of its positions' tokens and 10 bytes a token,
so a hit can be read back against the prompt; the disk tier is the real one, in a temporary
directory. tests/integration and tests/e2e run the real KV.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, cast

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllmmlxd.engine.cache.block_cache import BlockCache
from vllmmlxd.engine.cache.block_disk import DiskStore
from vllmmlxd.engine.cache.block_file import Tensor, decode

BYTES_PER_TOKEN = 10


class FakeBlocks:
    """Blocks as token lists; every operation counted."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    def blockable(self, cache):
        return True

    def positions(self, cache):
        return len(cache[0])

    def cut(self, cache, spans):
        self.calls["cut"] += 1
        self.calls["blocks_cut"] += len(spans)
        return [list(cache[0][s:e]) for s, e in spans]

    def join(self, blocks, n):
        self.calls["join"] += 1
        return [[t for b in blocks for t in b][:n]]

    def nbytes(self, block):
        return len(block) * BYTES_PER_TOKEN

    def to_tensors(self, block):
        return {"tokens": Tensor("I64", (len(block),), np.asarray(block, np.int64).tobytes())}

    def from_tensors(self, tensors, tokens):
        t = tensors.get("tokens")
        if t is None or t.shape != (tokens,) or t.dtype != "I64":
            raise ValueError("not a fake block")
        return np.frombuffer(t.data, np.int64).tolist()


def kv(tokens):
    return [list(tokens)]


def make(budget_tokens=10_000, block=4, **kw) -> BlockCache:
    return BlockCache(budget_tokens * BYTES_PER_TOKEN, FakeBlocks(), block_tokens=block, **kw)


def put(cache: BlockCache, tokens):
    return cache.insert(list(tokens), kv(tokens))


def held(cache: BlockCache) -> int:
    return cache.tree.tokens


# -- hits -------------------------------------------------------------------


def test_a_miss_then_an_exact_resend_is_a_whole_hit_less_the_last_token():
    cache = make()
    assert cache.lookup([1, 2, 3, 4, 5, 6]).hit_type == "none"
    put(cache, [1, 2, 3, 4, 5, 6])  # a full block and a partial one
    hit = cache.lookup([1, 2, 3, 4, 5, 6])
    assert (hit.hit_type, hit.cached_tokens, hit.cache) == ("exact", 5, [[1, 2, 3, 4, 5]])
    assert len(hit.source) == 2


def test_a_resent_history_is_a_prefix_hit_over_many_blocks():
    cache = make()
    history = list(range(100, 150))
    put(cache, history)
    hit = cache.lookup([*history, 7, 8, 9])
    assert hit.hit_type == "prefix" and hit.cached_tokens == 50 and hit.cache == [history]


def test_a_diverging_prompt_uses_the_start_of_the_block_where_it_diverges():
    cache = make()
    put(cache, range(20))
    hit = cache.lookup([*range(10), 99, 98])
    assert hit.hit_type == "lcp" and hit.cached_tokens == 10 and hit.cache == [list(range(10))]
    assert [cache.tree.nodes[i].start for i in hit.source] == [0, 4, 8]  # the third used in part


def test_the_longest_match_wins_among_siblings():
    cache = make()
    put(cache, [1, 2])
    put(cache, [5, 6, 7, 8])
    put(cache, [1, 2, 3, 4, 9])
    assert cache.lookup([1, 2, 3, 4, 5]).cached_tokens == 4
    put(cache, [1, 2, 3, 7, 7])
    put(cache, [1, 2, 3, 5, 6])
    hit = cache.lookup([1, 2, 3, 5, 9])  # three siblings share 3 tokens; one shares 4
    assert hit.cached_tokens == 4 and hit.cache == [[1, 2, 3, 5]]


def test_a_prompt_shorter_than_what_is_held_gets_all_but_its_last_token():
    cache = make()
    put(cache, range(12))
    hit = cache.lookup(list(range(6)))
    assert hit.hit_type == "lcp" and hit.cached_tokens == 5


def test_conversations_sharing_a_system_prompt_hold_it_once():
    cache = make(block=32)
    system = list(range(1000, 2500))  # 1,500 tokens
    one = make(block=32)
    put(one, [*system, 1, 2, 3, *list(range(10))])
    for i in range(8):
        put(cache, [*system, 1, 2, 3, *list(range(10 * i, 10 * i + 10))])
    assert cache.nbytes <= 1.3 * one.nbytes
    # What each conversation holds on its own: its tail and the shared block it diverges in.
    assert held(cache) == 46 * 32 + 8 * (1513 - 46 * 32)
    for i in range(8):
        tokens = [*system, 1, 2, 3, *list(range(10 * i, 10 * i + 10))]
        assert cache.lookup(tokens).hit_type == "exact"


# -- what is stored -----------------------------------------------------------


def test_a_longer_sequence_replaces_the_partial_block_it_extends_and_a_covered_one_is_not_stored():
    cache = make()
    dropped: list[int] = []
    cache.on_drop = dropped.append
    first = put(cache, [1, 2, 3, 4, 5, 6])
    assert [(s, e) for _, s, e in first] == [(0, 4), (4, 6)]
    second = put(cache, [1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert [(s, e) for _, s, e in second] == [(4, 8), (8, 9)]  # only the blocks not held
    assert dropped == [first[1][0]]  # the partial [5, 6] block, replaced
    assert held(cache) == 9 and cache.nbytes == 9 * BYTES_PER_TOKEN
    assert put(cache, [1, 2, 3, 4, 5]) is None  # a start of a held block: covered
    assert put(cache, [1, 2, 3, 4, 5, 6, 7, 8]) is None
    assert held(cache) == 9 and cache.ops.calls["cut"] == 2


def test_pieces_and_drops_account_for_every_block():
    cache = make(budget_tokens=40)
    live: set[int] = set()
    cache.on_drop = live.discard  # a new block evicted by its own insert is dropped before it is reported
    rng = np.random.default_rng(1)
    for _ in range(200):
        prompt = rng.integers(0, 3, rng.integers(1, 20)).tolist()
        cache.lookup(prompt)
        for piece, _, _ in put(cache, prompt) or []:
            live.add(piece)
    assert live == set(cache.tree.nodes)


def test_stored_blocks_are_private_copies():
    cache = make()
    source = kv([1, 2, 3, 4, 5])
    cache.insert([1, 2, 3, 4, 5], source)
    source[0][0] = 99
    hit = cache.lookup([1, 2, 3, 4, 5, 6])
    assert hit.cache == [[1, 2, 3, 4, 5]]
    hit.cache[0].append(42)
    assert cache.lookup([1, 2, 3, 4, 5, 6]).cache == [[1, 2, 3, 4, 5]]


def test_a_sequence_larger_than_the_whole_budget_is_never_stored():
    cache = make(budget_tokens=5)
    assert put(cache, range(6)) is None
    assert len(cache) == 0 and cache.stats.too_large == 1


def test_a_zero_budget_disables_the_cache():
    cache = make(budget_tokens=0)
    assert not cache.enabled and put(cache, [1, 2]) is None
    assert cache.lookup([1, 2, 3]).hit_type == "none" and cache.stats.lookups == 0


# -- eviction -----------------------------------------------------------------


def test_eviction_goes_leaf_by_leaf_least_recently_used_first_and_keeps_shared_blocks():
    cache = make(budget_tokens=20)
    system = [9, 9, 9, 9, 8, 8, 8, 8]  # two blocks every conversation shares
    put(cache, [*system, 1, 1, 1, 1])
    put(cache, [*system, 2, 2, 2, 2])
    cache.lookup([*system, 1, 1, 1, 1, 0])  # the first conversation is used again
    cache.begin_step()
    put(cache, [*system, 3, 3, 3, 3, 3, 3, 3, 3])  # 24 tokens over a budget of 20: one leaf goes
    assert cache.lookup([*system, 2, 2, 2, 2, 0]).cached_tokens == 8  # its own block went, the shared stay
    assert cache.lookup([*system, 1, 1, 1, 1, 0]).cached_tokens == 12
    assert cache.stats.evictions == 1 and cache.nbytes <= cache.budget_bytes


def test_a_block_a_lookup_of_this_step_used_is_evicted_last():
    cache = make(budget_tokens=16)
    a, b = [1] * 8, [2] * 4
    put(cache, a)
    put(cache, b)
    cache.begin_step()
    assert cache.lookup([*a, 5]).cached_tokens == 8  # its path is pinned for this step
    put(cache, b)  # held already: b is touched (not pinned), so a is the least recently used
    put(cache, [3] * 8)  # 8 tokens over: b goes, not the older but pinned a
    assert cache.lookup([*b, 5]).hit_type == "none"
    assert cache.lookup([*a, 5]).cached_tokens == 8
    cache.begin_step()  # the next step: a is unpinned, and least recently used after [3]...
    cache.lookup([3] * 8 + [5])
    cache.begin_step()
    put(cache, [4] * 8)
    assert cache.lookup([*a, 5]).hit_type == "none" and cache.nbytes <= cache.budget_bytes


def test_the_number_of_blocks_is_capped_whatever_their_bytes():
    cache = make(max_blocks=10)
    for i in range(20):
        put(cache, [i] * 8)
    assert len(cache) == 10 and cache.stats.evictions == 40 - 10
    assert cache.lookup([19] * 8 + [0]).cached_tokens == 8


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=30), min_size=1, max_size=40),
    st.integers(1, 60),
    st.integers(1, 5),
)
def test_the_budget_holds_and_every_hit_is_a_true_prefix(prompts, budget_tokens, block):
    cache = make(budget_tokens=budget_tokens, block=block)
    for prompt in prompts:
        cache.begin_step()
        hit = cache.lookup(prompt)
        if hit.cache is not None:
            assert hit.cache[0] == prompt[: hit.cached_tokens] and 0 < hit.cached_tokens < len(prompt)
        put(cache, prompt)
        assert cache.nbytes <= cache.budget_bytes
        nodes = cache.tree.nodes.values()
        assert cache.nbytes == sum(len(n.payload) for n in nodes) * BYTES_PER_TOKEN
        assert all(len(n.payload) == n.tokens and n.tokens <= block for n in nodes)
        assert all(not n.children for n in nodes if n.tokens < block)  # partial blocks are leaves


# -- cost -------------------------------------------------------------------


def lookup_cost(entries: int) -> tuple[int, Counter]:
    """Probes and KV operations of one lookup of a 200-token prompt in a cache of ``entries`` conversations,
    all sharing a 64-token start, half of them sharing its next 64 tokens too."""
    cache = make(budget_tokens=10**9, block=32)
    rng = np.random.default_rng(7)
    shared = list(range(64))
    for i in range(entries):
        middle = list(range(64, 128)) if i % 2 else rng.integers(0, 50_000, 64).tolist()
        put(cache, shared + middle + rng.integers(0, 50_000, 40).tolist())
    prompt = shared + list(range(64, 128)) + rng.integers(0, 50_000, 72).tolist()
    fake = cast(Any, cache.ops)  # the counting ops: their calls
    before, ops = cache.tree.probes, Counter(fake.calls)
    hit = cache.lookup(prompt)
    assert hit.cached_tokens == 128
    return cache.tree.probes - before, fake.calls - ops


def test_a_lookup_costs_what_the_prompt_costs_not_what_the_cache_holds():
    few, few_ops = lookup_cost(10)
    many, many_ops = lookup_cost(10_000)
    # One child lookup per block matched, one more where it diverges, and at most two neighbours compared.
    assert few <= 128 // 32 + 3 and many <= 128 // 32 + 3
    assert many_ops == few_ops == Counter({"join": 1})


def test_an_insert_costs_what_the_sequence_costs():
    cache = make(budget_tokens=10**9, block=32)
    rng = np.random.default_rng(3)
    for _ in range(10_000):
        put(cache, rng.integers(0, 50_000, 40).tolist())
    before = cache.tree.probes
    put(cache, rng.integers(0, 50_000, 100).tolist())
    assert cache.tree.probes - before <= 100 // 32 + 1 + 32 + 1  # blocks walked, partial starts checked


# -- the disk tier --------------------------------------------------------------


@pytest.fixture
def disk(tmp_path):
    store = DiskStore(tmp_path / "kv", "ab" * 16, 10**9)
    yield store
    store.close()


def test_full_blocks_are_written_to_disk_and_a_new_cache_reads_them_back(disk):
    first = make(block=4, disk=disk)
    tokens = list(range(1, 12))  # two full blocks and a partial one
    put(first, tokens)
    assert disk.flush() and disk.stats.written == 2
    fresh = make(block=4, disk=disk)  # a restarted worker: nothing in memory
    hit = fresh.lookup(tokens)
    assert hit.cached_tokens == 8 and hit.cache == [tokens[:8]] and hit.hit_type == "prefix"
    assert fresh.disk_hits == 1 and disk.stats.reads == 2
    assert fresh.lookup(tokens).cached_tokens == 8 and disk.stats.reads == 2  # in memory now
    put(fresh, [*tokens, 20, 21])
    assert disk.flush() and disk.stats.written == 3  # the read-back blocks are not written again


def test_a_block_whose_arrays_do_not_fit_is_a_miss_and_goes(disk):
    cache = make(block=4, disk=disk)
    put(cache, list(range(1, 9)))
    assert disk.flush()
    cache.ops.from_tensors = lambda tensors, tokens: (_ for _ in ()).throw(ValueError("another layout"))
    fresh = make(block=4, disk=disk)
    fresh.ops.from_tensors = cache.ops.from_tensors
    assert fresh.lookup(list(range(1, 10))).hit_type == "none"
    assert disk.flush() and disk.stats.removed == 1 and disk.stats.rejected == 1


def test_a_damaged_block_in_the_middle_of_a_chain_ends_the_hit_there(disk):
    cache = make(block=4, disk=disk)
    tokens = list(range(1, 14))  # three full blocks and a partial one
    put(cache, tokens)
    assert disk.flush() and disk.stats.written == 3
    second = cache.tree.exact(cache.tree.nodes[1].key + cache.tree.nodes[2].key)[0][1]
    path = disk.path(second.digest.hex())
    path.write_bytes(path.read_bytes()[:-1])  # truncated
    fresh = make(block=4, disk=disk)
    hit = fresh.lookup(tokens)
    assert hit.cached_tokens == 4 and hit.cache == [tokens[:4]]  # the first block, then a prefill
    assert disk.flush() and not path.exists() and disk.stats.rejected == 1
    put(fresh, tokens)  # the next insert writes it again, whole
    assert disk.flush() and path.exists() and make(block=4, disk=disk).lookup(tokens).cached_tokens == 12


def test_a_block_read_back_replaces_the_partial_block_it_extends(disk):
    put(make(block=4, disk=disk), list(range(1, 9)))
    assert disk.flush()
    fresh = make(block=4, disk=disk)
    put(fresh, [1, 2, 3, 4, 5, 6])  # the first block, and a partial [5, 6]
    hit = fresh.lookup(list(range(1, 10)))
    assert hit.cached_tokens == 8 and len(fresh) == 2 and fresh.tree.tokens == 8


def test_a_block_file_holds_its_tokens_only_as_a_keyed_hash(disk):
    cache = make(block=4, disk=disk)
    put(cache, [101, 202, 303, 404, 505])
    assert disk.flush() and disk.stats.written == 1
    (path,) = disk.dir.rglob("*.safetensors")
    _, metadata = decode(path.read_bytes(), disk._key)
    chunk = cache.tree.nodes[1].key  # the first full block's tokens
    assert metadata["tokens"] == disk.seal(chunk)
    assert chunk.hex() not in path.read_bytes().decode("latin-1")
