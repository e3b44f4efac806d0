"""The block cache: attention KV in fixed-size token blocks in a prefix tree, shared, with a disk tier.

A stored sequence is a path of blocks (``block_tree``): ``BLOCK_TOKENS`` positions each, the
last one maybe partial (a leaf, so an exact resend is a whole hit; a longer sequence replaces
it). Sequences that start alike share their blocks, so N conversations on one system prompt
hold it once. A lookup walks the tree along the prompt (one dict lookup per block), may use the
start of the last block it reaches (a longest common prefix inside a block), and returns a
private compact copy of at most all but the prompt's last token (the blocks joined): nothing a
running request uses is evicted from under it. An insert cuts only the blocks not held yet.

Eviction is by block, least recently used first among the leaves (blocks no other block
depends on), never a block on the path of a lookup of the current step unless nothing else is
left, until the real bytes of the stored arrays fit the budget and the blocks number at most
``max_blocks``. With a disk tier (``block_disk``), each new full block is also written to disk
(by the disk's own thread), and a walk that runs out of blocks in memory goes on on disk.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, cast

from .block_disk import DiskStore
from .block_file import Tensor
from .block_tree import DIGEST_BYTES, TOKEN_BYTES, BlockTree, Node, chain_digest, token_bytes
from .checkpoints import Captures
from .prefix_cache import CacheHit, CacheStats, HitType, Piece

if TYPE_CHECKING:
    from .layered_kv import LayeredKV

# A conversation that leaves a shared start inside a block holds that block's shared part again,
# so smaller blocks share more: at 32, at most 31 tokens of a system prompt are held twice.
# Cutting and joining cost about the same from 16 to 256 tokens a block (one array per block
# for keys, one for values: bandwidth-bound, measured on SmolLM2's KV), but each block has a
# fixed cost: ~50 us to cut on the engine thread (2,048 positions of builtin:tiny's KV: 3-4 ms in
# 32-token blocks, 1.5-3 ms in 64s, 8 ms in 16s), a node in the tree and a file on disk.
BLOCK_TOKENS = 32
# Blocks at most whatever their bytes: a block's bookkeeping (its node, key and arrays' handles,
# about 1 KB of Python objects) is not in the byte budget, and tiny KV (builtin:tiny: 16 KB a
# block) would otherwise fit millions of them.
MAX_BLOCKS = 50_000


class BlockOps(Protocol):
    """KV operations on blocks (``kv.BlockKV``, ``layered_kv.LayeredKV``; a fake one in unit tests)."""

    def blockable(self, cache: list[Any]) -> bool: ...
    def positions(self, cache: list[Any]) -> int | None: ...
    def cut(self, cache: list[Any], spans: list[tuple[int, int]]) -> list[Any]: ...
    def join(self, blocks: list[Any], n: int) -> list[Any]: ...
    def nbytes(self, block: Any) -> int: ...
    def to_tensors(self, block: Any) -> dict[str, Tensor]: ...
    def from_tensors(self, tensors: dict[str, Tensor], tokens: int) -> Any: ...


def state_name(node: Node) -> str:
    """The disk tier's name of the checkpoint kept on ``node``."""
    return chain_digest(node.digest, b"state").hex()


class BlockCache:
    def __init__(
        self,
        budget_bytes: int,
        ops: BlockOps,
        *,
        block_tokens: int = BLOCK_TOKENS,
        max_blocks: int = MAX_BLOCKS,
        disk: DiskStore | None = None,
        kv_bits: int | None = None,
    ):
        self.budget_bytes = budget_bytes
        self.ops = ops
        self.block = block_tokens
        self.max_blocks = max_blocks
        self.disk = disk
        self.kv_bits = kv_bits
        self.stats = CacheStats()
        self.disk_hits = 0  # lookups that read at least one block back from disk
        self.disk_tokens = 0  # prompt tokens those blocks served
        self.unblockable = 0  # sequences whose KV was not plain attention KV: not stored
        self.disk_off: str | None = None  # why an entry that asked for a disk tier has none
        # The disk's names chain from its fingerprint, so a block's name says which model wrote it.
        root = bytes.fromhex(disk.fingerprint)[:DIGEST_BYTES] if disk is not None else bytes(DIGEST_BYTES)
        self.tree = BlockTree(block_tokens, root)
        # Told of each block that leaves (evicted, replaced, cleared): a sharded entry's other
        # ranks drop their copy of it (engine/distributed/lockstep.py).
        self.on_drop: Callable[[int], None] = lambda block: None
        self._fetched = 0
        # A layered model's blocks (windowed layers' KV too) and its recurrent states' checkpoints.
        self.layered = cast("LayeredKV", ops) if getattr(ops, "cache_layout", None) is not None else None
        self.checkpointed = self.layered is not None and bool(self.layered.states)
        self.state_hits = 0  # lookups that continued from a checkpoint
        self.state_evictions = 0  # checkpoints dropped from blocks that stayed

    @property
    def enabled(self) -> bool:
        return self.budget_bytes > 0

    @property
    def nbytes(self) -> int:
        return self.tree.nbytes

    def __len__(self) -> int:
        return len(self.tree)

    def begin_step(self) -> None:
        """A new scheduler step: the paths the last step's lookups pinned may go again."""
        self.tree.pinned.clear()

    # -- lookup -----------------------------------------------------------

    def lookup(self, tokens: list[int]) -> CacheHit:
        """The longest cached start of ``tokens`` (at most all but the last token, which must be
        fed); a recurrent model's, up to the last checkpoint within it."""
        if not self.enabled:
            return CacheHit(None, 0, "none")
        self.stats.lookups += 1
        self._fetched = 0
        match = self.tree.match(token_bytes(tokens), self._fetch if self.disk is not None else None)
        nodes = match.nodes
        usable = min(match.tokens, len(tokens) - 1)
        state = None
        if self.checkpointed and usable > 0:
            found = self._resume(match.path, usable)
            usable, nodes = (nodes[found].end, nodes[: found + 1]) if found is not None else (0, [])
            state = nodes[-1].state if nodes else None
        if usable <= 0:
            self._evict()  # blocks read back from disk count against the budget
            return CacheHit(None, 0, "none", shared=match.tokens)
        last = match.nodes[-1]
        if match.tail is None and not last.children:
            kind: HitType = "exact" if match.tokens == len(tokens) else "prefix"
        else:
            kind = "lcp"
        self.tree.touch(nodes, pin=True)
        needed = [n for n in nodes if n.start < usable]
        payloads = [n.payload for n in needed]
        if self.layered is not None:
            cache = self.layered.join(payloads, usable, state)
            self.state_hits += state is not None
        else:
            cache = self.ops.join(payloads, usable)
        self.stats.hits += 1
        self.stats.cached_tokens += usable
        if self._fetched:
            self.disk_hits += 1
            self.disk_tokens += sum(n.tokens for n in needed if n.on_disk)
        self._evict()
        return CacheHit(cache, usable, kind, tuple(n.id for n in needed), shared=match.tokens)

    def _resume(self, path: list[Node], usable: int) -> int | None:
        """The deepest block of ``path`` ending within ``usable`` that holds a checkpoint (read
        back from the disk tier for blocks that came from there), or None."""
        for i in range(len(path) - 1, -1, -1):
            node = path[i]
            if node.end > usable:
                continue
            if node.state is None and (node.on_disk or node.state_on_disk) and self.disk is not None:
                self._fetch_state(node)
            if node.state is not None:
                return i
        return None

    def _fetch_state(self, node: Node) -> None:
        assert self.disk is not None and self.layered is not None
        name = state_name(node)
        tensors = self.disk.get(name, {"state_of": node.digest.hex()})
        if tensors is None:
            return
        try:
            state = self.layered.state_from_tensors(tensors)
        except ValueError as exc:  # right checksum, wrong arrays: written by another layout
            self.disk.reject(name, str(exc))
            return
        self.tree.attach(node, state, self.layered.state_nbytes(state))
        node.state_on_disk = True

    def _fetch(self, parent: Node, chunk: bytes) -> Node | None:
        """The full block ``chunk`` after ``parent`` from the disk tier, added to the tree; or None."""
        assert self.disk is not None
        name = self._name(parent, chunk)
        tensors = self.disk.get(name, {"parent": parent.digest.hex(), "tokens": self.disk.seal(chunk)})
        if tensors is None:
            return None
        try:
            block = self.ops.from_tensors(tensors, self.block)
        except ValueError as exc:  # right checksum, wrong arrays: written by another layout
            self.disk.reject(name, str(exc))
            return None
        self._fetched += 1
        for leaf in self.tree.partial_starts(parent, chunk):
            self._remove(leaf)  # a partial block this one extends: replaced, as an insert does
        return self.tree.add(parent, chunk, block, self.ops.nbytes(block), on_disk=True)

    # -- insert -----------------------------------------------------------

    def insert(
        self, tokens: list[int], cache: list[Any], *, owned: bool = False, captures: Captures | None = None
    ) -> list[Piece] | None:
        """Keep the KV of ``tokens``: the blocks not held yet are cut from ``cache`` (always copied:
        ``owned`` changes nothing), a layered model's with what the sequence ``captures``d on its
        way (windowed KV, checkpoints). Returns the new blocks as (id, start, end), or None if none."""
        if not self.enabled or not tokens:
            return None
        if not self.ops.blockable(cache):
            self.unblockable += 1
            return None
        held = self.ops.positions(cache)
        n = len(tokens) if held is None else min(len(tokens), held)
        key = token_bytes(tokens[:n])
        path, pos = self.tree.exact(key)
        parent = path[-1] if path else self.tree.root
        rest = key[pos:]
        step = self.block * TOKEN_BYTES
        covering = self.tree.covering(parent, rest) if 0 < len(rest) < step else None
        if not rest or covering is not None:
            self.tree.touch(path + ([covering] if covering is not None else []))
            self._checkpoint(path, cache, captures, n)
            return None  # held already (a longer block starting with the rest serves it too)
        first, stop = parent.end, len(key) // TOKEN_BYTES
        spans = [(s, min(s + self.block, stop)) for s in range(first, stop, self.block)]
        if self.layered is not None:
            blocks = self.layered.cut(cache, spans, captures)
            spans = spans[: len(blocks)]
        else:
            blocks = self.ops.cut(cache, spans)
        sizes = [self.ops.nbytes(b) for b in blocks]
        if not blocks or sum(sizes) > self.budget_bytes:
            self.stats.too_large += bool(blocks)
            self.tree.touch(path)
            self._checkpoint(path, cache, captures, n)
            return None
        for leaf in self.tree.partial_starts(parent, rest[:step]):
            self._remove(leaf)  # a partial block this one extends: replaced
        new: list[Node] = []
        node = parent
        for (start, end), block, size in zip(spans, blocks, sizes):
            node = self.tree.add(node, key[start * TOKEN_BYTES : end * TOKEN_BYTES], block, size)
            new.append(node)
        self.tree.touch(path + new)
        self.stats.inserts += 1
        self._write(new)
        self._checkpoint(path + new, cache, captures, n)
        self._evict()
        kept = [(n.id, n.start, n.end) for n in new if n.id in self.tree.nodes]
        return kept or None

    def _checkpoint(self, nodes: list[Node], cache: list[Any], captures: Captures | None, n: int) -> None:
        """Keep on each of ``nodes`` the state the sequence had after its last token, where it was
        checkpointed there (or ``cache``'s own, at its end ``n``)."""
        if not self.checkpointed or not nodes:
            return
        layered = cast("LayeredKV", self.layered)
        for node in nodes:
            if node.state is not None:
                continue
            state = captures.states.get(node.end) if captures is not None else None
            if state is None and node.end == n:
                state = layered.final_state(cache)
            if state is None:
                continue
            self.tree.attach(node, state, layered.state_nbytes(state))
            self._write_state(node)

    def _write_state(self, node: Node) -> None:
        """A full block's checkpoint to the disk tier (its block's file is written apart)."""
        disk, layered = self.disk, self.layered
        if disk is None or layered is None or node.state_on_disk or node.tokens < self.block:
            return
        if not disk.room(node.state_bytes):
            return
        meta = {"state_of": node.digest.hex(), "fingerprint": disk.fingerprint}
        disk.put(state_name(node), layered.state_tensors(node.state), meta)
        node.state_on_disk = True

    def _write(self, nodes: list[Node]) -> None:
        """New full blocks to the disk tier (host copies made here; the writer thread writes them)."""
        if self.disk is None:
            return
        for node in nodes:
            name = node.digest.hex()
            if node.tokens < self.block or node.on_disk or self.disk.known(name) or not self.disk.room(node.nbytes):
                continue
            assert node.parent is not None
            meta = {
                "parent": node.parent.digest.hex(),
                "tokens": self.disk.seal(node.key),  # keyed: the file never holds the prompt's ids
                "fingerprint": self.disk.fingerprint,
            }
            self.disk.put(name, self.ops.to_tensors(node.payload), meta)

    @staticmethod
    def _name(parent: Node, chunk: bytes) -> str:
        return chain_digest(parent.digest, chunk).hex()

    # -- eviction ---------------------------------------------------------

    def _evict(self) -> None:
        """Least recently used first: leaf blocks (with their checkpoints), and a recurrent model's
        checkpoints on inner blocks, which go before a leaf used as recently (their blocks stay:
        a conversation keeps its KV and its last state longest)."""
        tree = self.tree
        while tree.nbytes > self.budget_bytes or len(tree) > self.max_blocks:
            leaf = tree.oldest_leaf()
            inner = tree.oldest_inner_state() if self.checkpointed and tree.nbytes > self.budget_bytes else None
            if inner is not None and (leaf is None or inner.used <= leaf.used):
                tree.detach(inner)
                self.state_evictions += 1
                continue
            leaf = leaf or tree.oldest_leaf(pinned_too=True)
            if leaf is None:
                break
            self._remove(leaf)
            self.stats.evictions += 1

    def _remove(self, node: Node) -> None:
        self.tree.remove(node)
        self.on_drop(node.id)

    def clear(self) -> None:
        for block in self.tree.clear():
            self.on_drop(block)

    def close(self) -> None:
        """Let the disk writer finish what it was handed, then stop it."""
        if self.disk is not None:
            self.disk.close()

    def _layered_status(self) -> dict:
        """What a layered model's blocks hold beyond attention KV: windows, checkpoints and their cost."""
        if self.layered is None:
            return {}
        layout = self.layered.cache_layout
        return {
            "holds": layout.prefix_cache(self.block),
            "checkpoints": self.tree.states if self.checkpointed else None,
            "checkpoint_bytes": self.layered.state_bytes() if self.checkpointed else None,
            "checkpoint_hits": self.state_hits if self.checkpointed else None,
            "checkpoint_evictions": self.state_evictions if self.checkpointed else None,
        }

    def describe(self) -> dict:
        """The ``cache`` block of /v1/status."""
        tree = self.tree
        return {
            "type": "prefix_blocks",
            "block_tokens": self.block,
            "entries": len(tree),  # blocks, under the name whole-entry caches use
            "max_entries": self.max_blocks,
            "tokens": tree.tokens,
            "kv_bytes_per_token": round(tree.nbytes / tree.tokens, 1) if tree.tokens else None,
            "kv_bits": self.kv_bits,
            "hit_rate": round(self.stats.hit_rate, 3),
            "memory_mb": round(tree.nbytes / 1024**2, 3),
            "memory_bytes": tree.nbytes,
            "budget_mb": round(self.budget_bytes / 1024**2, 1),
            "hits": self.stats.hits,
            "misses": self.stats.lookups - self.stats.hits,
            "cached_tokens": self.stats.cached_tokens,
            "evictions": self.stats.evictions,
            **self._layered_status(),
            "disk": (
                {**self.disk.describe(), "hits": self.disk_hits, "cached_tokens": self.disk_tokens}
                if self.disk is not None
                else {"off": self.disk_off}
                if self.disk_off
                else None
            ),
        }
