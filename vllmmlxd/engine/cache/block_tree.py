"""The block cache's prefix tree: which token blocks are held, how a prompt walks them, which goes first.

A node is one block of a sequence's tokens (``block`` tokens, or fewer for a sequence's last,
partial block, which is always a leaf); its children are the blocks that follow it. Keys are
the block's tokens as fixed-width bytes, so a child is found by one dict lookup and a walk
along a prompt costs one lookup per block: what the prompt's length costs, never the number
of blocks held. A prompt's chunk that matches no child exactly may share a start with one:
the child sharing the longest start is a neighbour of the chunk in the children's sorted
order (true of any lexicographic order), found by bisection.

Recency: a touch stamps every node of a path with one tick, so a block is never older than
a block under it, and least recently used among the leaves is least recently used among the
blocks nothing else depends on. Leaves wait in a heap (stale entries are skipped when popped).
Nodes on the path of a lookup of the current step are *pinned*: eviction takes them last.

Pure bookkeeping: a node carries its KV as an opaque payload and its size in bytes.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
from bisect import bisect_left, insort
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

TOKEN = np.dtype(">i8")  # a token as 8 big-endian bytes (image keys are negative ids)
TOKEN_BYTES = TOKEN.itemsize
DIGEST_BYTES = 16


def token_bytes(tokens: Any) -> bytes:
    """Tokens as the tree's key bytes."""
    return np.asarray(tokens, dtype=np.int64).astype(TOKEN).tobytes()


def chain_digest(parent: bytes, key: bytes) -> bytes:
    """A block's name: a hash of its parent's name and its own tokens, so it names the whole start."""
    return hashlib.blake2b(parent + key, digest_size=DIGEST_BYTES).digest()


def common_tokens(a: bytes, b: bytes) -> int:
    """How many leading tokens two keys share."""
    n = min(len(a), len(b)) // TOKEN_BYTES
    if n == 0 or a[: n * TOKEN_BYTES] == b[: n * TOKEN_BYTES]:
        return n
    x = np.frombuffer(a, TOKEN, n)
    y = np.frombuffer(b, TOKEN, n)
    return int(np.flatnonzero(x != y)[0])


@dataclass(eq=False)
class Node:
    id: int
    key: bytes  # this block's tokens (TOKEN_BYTES each)
    parent: Node | None
    start: int  # the position of its first token
    digest: bytes  # chain_digest(parent's, key): its file's name in the disk tier
    payload: Any = None
    nbytes: int = 0
    used: int = 0
    on_disk: bool = False  # read back from (so already in) the disk tier
    # A recurrent model's state after this block's last token (a checkpoint: engine/cache/checkpoints.py).
    state: Any = None
    state_bytes: int = 0
    state_on_disk: bool = False  # its checkpoint is in the disk tier (written, or read back)
    children: dict[bytes, Node] = field(default_factory=dict)
    order: list[bytes] = field(default_factory=list)  # the children's keys, sorted
    partial_children: int = 0  # children shorter than a block (leaves a longer block may replace)
    tokens: int = field(init=False)
    end: int = field(init=False)  # the position after its last token

    def __post_init__(self) -> None:
        self.tokens = len(self.key) // TOKEN_BYTES
        self.end = self.start + self.tokens


@dataclass
class Match:
    """How far a key goes down the tree: whole nodes, then maybe the start of one more."""

    path: list[Node]
    tail: Node | None = None  # a node whose first ``tail_tokens`` tokens match, after the path
    tail_tokens: int = 0

    @property
    def tokens(self) -> int:
        return (self.path[-1].end if self.path else 0) + self.tail_tokens

    @property
    def nodes(self) -> list[Node]:
        return self.path + ([self.tail] if self.tail is not None else [])


# Given the node a walk reached and the next full chunk (no child of that node holds it), a block
# found elsewhere (the disk tier), added under the node; or None.
Fetch = Callable[[Node, bytes], "Node | None"]


class BlockTree:
    def __init__(self, block: int, root_digest: bytes = bytes(DIGEST_BYTES)):
        self.block = block
        self.root = Node(0, b"", None, 0, root_digest)
        self.nodes: dict[int, Node] = {}
        self.pinned: set[int] = set()
        self.nbytes = 0
        self.tokens = 0
        self.states = 0  # nodes holding a checkpoint
        self.probes = 0  # child lookups and key comparisons made by walks: their cost, counted (tests bound it)
        self._ids = itertools.count(1)
        self._clock = itertools.count(1)
        self._heap: list[tuple[int, int]] = []  # (used, id) of leaves; stale entries skipped when popped
        self._state_heap: list[tuple[int, int]] = []  # (used, id) of nodes holding a checkpoint, likewise

    def __len__(self) -> int:
        return len(self.nodes)

    # -- walks ------------------------------------------------------------

    def match(self, key: bytes, fetch: Fetch | None = None) -> Match:
        """The longest start of ``key`` held: whole blocks, then a block sharing the next chunk's start."""
        step = self.block * TOKEN_BYTES
        node, pos, path = self.root, 0, []
        while pos < len(key):
            chunk = key[pos : pos + step]
            self.probes += 1
            child = node.children.get(chunk)
            if child is None and fetch is not None and len(chunk) == step:
                child = fetch(node, chunk)
            if child is not None:
                path.append(child)
                pos += len(chunk)
                node = child
                continue
            best, shared = self._nearest(node, chunk)
            if best is not None and shared == best.tokens:
                path.append(best)  # a partial leaf that is a start of the chunk
            elif best is not None:
                return Match(path, best, shared)
            break
        return Match(path)

    def _nearest(self, node: Node, chunk: bytes) -> tuple[Node | None, int]:
        """The child sharing the longest start with ``chunk`` (a neighbour of it in sorted order)."""
        i = bisect_left(node.order, chunk)
        best, shared = None, 0
        for j in (i - 1, i):
            if 0 <= j < len(node.order):
                self.probes += 1
                n = common_tokens(node.order[j], chunk)
                if n > shared:
                    best, shared = node.children[node.order[j]], n
        return best, shared

    def exact(self, key: bytes) -> tuple[list[Node], int]:
        """The blocks that hold ``key``'s chunks exactly, from the root, and the bytes they cover."""
        step = self.block * TOKEN_BYTES
        node, pos, path = self.root, 0, []
        while pos < len(key):
            self.probes += 1
            child = node.children.get(key[pos : pos + step])
            if child is None:
                break
            path.append(child)
            pos += len(child.key)
            node = child
        return path, pos

    def covering(self, node: Node, chunk: bytes) -> Node | None:
        """A child of ``node`` that starts with the partial ``chunk`` (so already holds it)."""
        i = bisect_left(node.order, chunk)
        self.probes += 1
        if i < len(node.order) and node.order[i].startswith(chunk):
            return node.children[node.order[i]]
        return None

    def partial_starts(self, node: Node, chunk: bytes) -> list[Node]:
        """Partial leaves under ``node`` that are starts of ``chunk``: a longer block replaces them."""
        out: list[Node] = []
        if not node.partial_children:
            return out
        for n in range(1, len(chunk) // TOKEN_BYTES + 1):
            self.probes += 1
            child = node.children.get(chunk[: n * TOKEN_BYTES])
            if child is not None and child.tokens < self.block and len(child.key) <= len(chunk):
                out.append(child)
        return out

    # -- changes ----------------------------------------------------------

    def add(self, parent: Node, key: bytes, payload: Any, nbytes: int, *, on_disk: bool = False) -> Node:
        """A new block under ``parent`` (a leaf, stamped now)."""
        node = Node(
            next(self._ids),
            key,
            parent,
            parent.end,
            chain_digest(parent.digest, key),
            payload,
            nbytes,
            next(self._clock),
            on_disk,
        )
        parent.children[key] = node
        parent.partial_children += node.tokens < self.block
        insort(parent.order, key)
        self.nodes[node.id] = node
        self.nbytes += nbytes
        self.tokens += node.tokens
        heapq.heappush(self._heap, (node.used, node.id))
        return node

    def remove(self, node: Node) -> None:
        """Take out a leaf; its parent may become one."""
        assert not node.children and node.parent is not None
        parent = node.parent
        del parent.children[node.key]
        parent.partial_children -= node.tokens < self.block
        del parent.order[bisect_left(parent.order, node.key)]
        del self.nodes[node.id]
        self.pinned.discard(node.id)
        self.nbytes -= node.nbytes + node.state_bytes
        self.tokens -= node.tokens
        self.states -= node.state is not None
        node.payload = node.state = None
        if parent is not self.root and not parent.children:
            heapq.heappush(self._heap, (parent.used, parent.id))

    def attach(self, node: Node, state: Any, nbytes: int) -> None:
        """Keep ``state`` (a checkpoint after ``node``'s last token) on ``node``."""
        if node.state is not None:
            return
        node.state, node.state_bytes = state, nbytes
        self.nbytes += nbytes
        self.states += 1
        heapq.heappush(self._state_heap, (node.used, node.id))

    def detach(self, node: Node) -> None:
        """Drop ``node``'s checkpoint, keeping its block."""
        if node.state is None:
            return
        self.nbytes -= node.state_bytes
        self.states -= 1
        node.state, node.state_bytes = None, 0

    def oldest_inner_state(self) -> Node | None:
        """The least recently used checkpoint on a block others depend on (a leaf's goes with it),
        not pinned; None when there is none."""
        skipped, found = [], None
        while self._state_heap:
            used, key = heapq.heappop(self._state_heap)
            node = self.nodes.get(key)
            if node is None or node.state is None or node.used != used or not node.children:
                continue  # gone, dropped, touched since (pushed again then), or a leaf
            if key in self.pinned:
                skipped.append((used, key))
                continue
            found = node
            heapq.heappush(self._state_heap, (used, key))
            break
        for item in skipped:
            heapq.heappush(self._state_heap, item)
        return found

    def touch(self, nodes: list[Node], *, pin: bool = False) -> None:
        """Stamp ``nodes`` (a path from the root) as just used; ``pin``: a lookup's path, kept this step."""
        tick = next(self._clock)
        for node in nodes:
            node.used = tick
            if pin:
                self.pinned.add(node.id)
            if node.state is not None:
                heapq.heappush(self._state_heap, (tick, node.id))
        if nodes and not nodes[-1].children:
            heapq.heappush(self._heap, (tick, nodes[-1].id))
        if len(self._heap) > 2 * len(self.nodes) + 64:  # stale entries: rebuild from the leaves
            self._heap = [(n.used, n.id) for n in self.nodes.values() if not n.children]
            heapq.heapify(self._heap)
        if len(self._state_heap) > 2 * self.states + 64:
            self._state_heap = [(n.used, n.id) for n in self.nodes.values() if n.state is not None]
            heapq.heapify(self._state_heap)

    def oldest_leaf(self, *, pinned_too: bool = False) -> Node | None:
        """The least recently used leaf, pinned ones only when ``pinned_too``; None when there is none."""
        skipped = []
        found = None
        while self._heap:
            used, key = heapq.heappop(self._heap)
            node = self.nodes.get(key)
            if node is None or node.children or node.used != used:
                continue  # gone, no longer a leaf, or touched since
            if key in self.pinned and not pinned_too:
                skipped.append((used, key))
                continue
            found = node
            heapq.heappush(self._heap, (used, key))  # it stays a candidate until removed
            break
        for item in skipped:
            heapq.heappush(self._heap, item)
        return found

    def clear(self) -> list[int]:
        """Forget every block; returns their ids."""
        gone = list(self.nodes)
        self.root.children.clear()
        self.root.order.clear()
        self.nodes.clear()
        self.pinned.clear()
        self._heap.clear()
        self._state_heap.clear()
        self.nbytes = self.tokens = self.states = 0
        return gone
