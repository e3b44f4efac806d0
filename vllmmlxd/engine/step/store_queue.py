"""Finished sequences' KV on its way into the prefix cache, a few blocks a step.

Cutting a long sequence into the block cache copies all of its KV: for 2,200 tokens of
SmolLM2 on this project's CPU about 60-100 ms, which a running stream waited through in the
step its neighbour finished. The block cache takes a sequence's blocks in order, and
inserting a longer prefix of the same tokens cuts only the blocks it does not hold yet, so
here each step inserts ``blocks`` more of the oldest sequence waiting. A waiting request that
may want those blocks, or an idle engine, takes the rest at once (``advance(everything=True)``).
The KV waiting here is no longer in the batch: nothing writes to it.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ...log import log_event

logger = logging.getLogger("vllmmlxd.engine")

STEP_BLOCKS = 8  # blocks cut into the cache a step while streams run


@dataclass
class _Pending:
    key: list[int]  # the cache key of every position the KV holds
    cache: list[Any]
    captures: Any = None  # a layered model's windowed KV and checkpoints (checkpoints.Captures)
    done: int = 0  # positions inserted so far


class StoreQueue:
    """Sequences to store, oldest first; ``insert`` is the block cache's."""

    def __init__(self, insert: Callable[[list[int], list[Any], Any], Any], block: int, blocks: int = STEP_BLOCKS):
        self.insert = insert
        self.block = block
        self.blocks = blocks
        self.pending: deque[_Pending] = deque()

    def __len__(self) -> int:
        return len(self.pending)

    def add(self, key: list[int], cache: list[Any], captures: Any = None) -> None:
        self.pending.append(_Pending(key, cache, captures))

    def advance(self, *, everything: bool = False) -> None:
        """Insert the next ``blocks`` blocks (every block left, with ``everything``)."""
        room = self.blocks
        while self.pending and (everything or room > 0):
            head = self.pending[0]
            left = -(-(len(head.key) - head.done) // self.block)  # blocks, the last maybe partial
            take = left if everything else min(left, room)
            upto = min(len(head.key), head.done + take * self.block)
            try:
                self.insert(head.key[:upto], head.cache, head.captures)
            except Exception as exc:  # the cache is an optimisation: never fail a request over it
                log_event(logger, "cache.error", logging.WARNING, error=repr(exc))
                upto = len(head.key)
            room -= take
            head.done = upto
            if upto >= len(head.key):
                self.pending.popleft()

    # -- the scheduler's stores (``Stores``) ----------------------------------------------------

    def store(self, key: list[int], cache: list[Any], captures: Any, uid: int) -> None:
        self.add(key, cache, captures)

    def before_admission(self, *, waiting: bool) -> None:
        # A request about to be admitted may want what they hold; and their KV, no longer reserved,
        # is in the prefix cache's budget before another request's reservation takes its place.
        if waiting:
            self.advance(everything=True)

    def between_steps(self, *, idle: bool) -> None:
        """Off the critical step: a few blocks while others stream, the rest when idle."""
        self.advance(everything=idle)


class Stores(Protocol):
    """How the scheduler puts a finished sequence's KV into the prefix cache."""

    def store(self, key: list[int], cache: list[Any], captures: Any, uid: int) -> None: ...
    def before_admission(self, *, waiting: bool) -> None: ...
    def between_steps(self, *, idle: bool) -> None: ...


class StoreNow:
    """At once: the whole-sequence cache, and a sharded entry (whose other ranks cut the same
    pieces in the same frame as rank 0, ``kept``)."""

    def __init__(
        self,
        insert: Callable[[list[int], list[Any], Any], Any],
        kept: Callable[[int, list[Any]], None],
        *,
        distributed: bool,
    ):
        self.insert, self.kept, self.distributed = insert, kept, distributed

    def store(self, key: list[int], cache: list[Any], captures: Any, uid: int) -> None:
        try:
            pieces = self.insert(key, cache, captures)
        except Exception as exc:  # the cache is an optimisation: never fail a request over it
            log_event(logger, "cache.error", logging.WARNING, error=repr(exc))
            if self.distributed:
                raise  # entries dropped on the way were dropped on every rank: the ranks disagree now
            return
        if pieces:
            self.kept(uid, pieces)

    def before_admission(self, *, waiting: bool) -> None:
        pass

    def between_steps(self, *, idle: bool) -> None:
        pass
