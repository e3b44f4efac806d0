"""A rank other than 0: plays rank 0's step plans on its own share of the model.

Each frame carries a plan (``step_plan``); its changes and its pass run through the same
``Batch`` calls rank 0 made (``FollowerBatch.play``, below), and the pass's forward runs the
model's collectives with the other ranks. Nothing here decides: a plan that does not fit this
rank's state means the ranks disagree, and the rank exits (its worker is restarted as a whole).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from mlx_lm.generate import BatchGenerator

from ..batch.batch import Batch, Kept, RowSetup, make_generator
from ..batch.step_plan import Change, Drop, Extract, Finish, Join, Keep, Leave, StepPlan, from_wire
from ..cache.cache_setup import make_kv_ops
from ..options import EngineOptions
from .lockstep import FollowRankZero, Frame, FrameError, Kind, Link, decode, encode

__all__ = ["Diverged", "Follower"]


class Diverged(RuntimeError):
    """Rank 0's plan does not fit this rank's batch: the ranks no longer agree."""


class Mirror:
    """Another rank's copy of rank 0's prefix-cache pieces: its own share of their KV, cut from the
    same positions of the same sequences, under rank 0's ids."""

    def __init__(self, kv: Any):
        self.kv = kv  # the same kind of pieces as rank 0's cache (cache_setup.make_kv_ops)
        self.pieces: dict[int, Any] = {}
        self.pending: Kept = {}  # KV that came back for a row, until rank 0 says what it kept

    def caches(self, join: Join) -> list[Any] | None:
        if not join.source:
            return None
        missing = [i for i in join.source if i not in self.pieces]
        if missing:
            raise Diverged(f"prefix-cache pieces {missing} are not here")
        return self.kv.join([self.pieces[i] for i in join.source], join.cached)

    def keep(self, change: Keep) -> None:
        if change.uid not in self.pending:
            raise Diverged(f"rank 0 kept the cache of uid {change.uid}, which this rank does not hold")
        cache, _tokens = self.pending.pop(change.uid)
        cut = self.kv.cut(cache, [(start, end) for _, start, end in change.pieces])
        for (piece, _, _), kv in zip(change.pieces, cut):
            self.pieces[piece] = kv


class FollowerBatch(Batch):
    """A rank other than 0: plays rank 0's plans on its share of the model. It samples nothing of
    its own (each pass starts from rank 0's tokens: ``lockstep.FollowRankZero``)."""

    def __init__(self, gen: BatchGenerator, mirror: Mirror):
        super().__init__(gen)
        self.mirror = mirror
        self.running: set[int] = set()

    def play(self, plan: StepPlan) -> None:
        """Rank 0's changes, in order, then its pass; Diverged where one does not fit this batch."""
        for change in plan.changes:
            self._apply(change)
        if plan.chunk is not None:
            self.mirror.pending.clear()
            _, responses = self._pass(plan.chunk)
            for response in responses:
                if response.finish_reason is not None:  # max_tokens: the same count on every rank
                    self.running.discard(response.uid)
                    self.mirror.pending[response.uid] = (response.prompt_cache, [])

    def _apply(self, change: Change) -> None:
        match change:
            case Join():
                row = RowSetup([list(change.tokens)], self.mirror.caches(change))
                uid = self._insert(row, change.max_tokens)
                if uid != change.uid:
                    raise Diverged(f"rank 0 inserted uid {change.uid}, this rank's batch gave {uid}")
                self.running.add(uid)
            case Leave():
                self._leave(list(change.uids), change.keep)
            case Extract():
                self.mirror.pending.update(self.gen.extract_cache(list(change.uids)))
            case Finish():  # ended on rank 0 by a stop token or string: here too, unless max_tokens did
                still = [uid for uid in change.uids if uid in self.running]
                if still:
                    self._leave(still, True)
            case Keep():
                self.mirror.keep(change)
            case Drop():
                self.mirror.pieces.pop(change.piece, None)

    def _leave(self, uids: list[int], keep: bool) -> None:
        self.running.difference_update(uids)
        self.mirror.pending.update(self._remove(uids, keep))


class Follower:
    def __init__(
        self,
        model: Any,
        options: EngineOptions,
        link: Link,
        *,
        ops: Any = None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.link = link
        gen = make_generator(FollowRankZero(model, link), options)  # each pass starts from rank 0's tokens
        # The same kind of pieces as rank 0's cache.
        self.mirror = Mirror(ops or make_kv_ops(model, options, distributed=True))
        self.batch = FollowerBatch(gen, self.mirror)
        self.clock = clock
        self.sleep = time.sleep
        self.seq = 0
        self.steps = 0
        self.step_s = 0.0  # the last step's time
        self.wait_s = 0.0  # the last wait for a frame
        self.pid = os.getpid()

    @property
    def running(self) -> set[int]:
        return self.batch.running

    @property
    def shadow(self) -> dict[int, Any]:
        """Rank 0's prefix-cache piece id -> this rank's KV of it."""
        return self.mirror.pieces

    def run(self) -> None:
        """Follow rank 0 until it says stop (an exception means the ranks disagree: the caller exits)."""
        while self.follow_one().kind is not Kind.STOP:
            pass

    def report(self) -> bytes:
        body = {
            "seq": self.seq,
            "steps": self.steps,
            "step_ms": round(self.step_s * 1000, 3),
            "wait_ms": round(self.wait_s * 1000, 3),
            "pid": self.pid,
            "rank": self.link.rank,
        }
        return encode(Frame(Kind.REPORT, self.seq, body))[0]

    def follow_one(self) -> Frame:
        waited = self.clock()
        raw, overflow = self.link.follow(self.report())
        self.wait_s = self.clock() - waited
        frame = decode(raw, overflow)
        if frame.seq != self.seq + 1:
            raise Diverged(f"frame {frame.seq} after frame {self.seq}")
        self.seq = frame.seq
        try:
            plan = from_wire(frame.body)
        except ValueError as exc:
            raise FrameError(f"frame {frame.seq}: {exc}") from None
        started = self.clock()
        self.batch.play(plan)
        if plan.chunk is not None:
            self.step_s = self.clock() - started
            self.steps += 1
        if frame.kind is Kind.IDLE:
            # Rank 0 has nothing to run: sleep rather than poll in the next collective.
            self.sleep(float(frame.body.get("sleep_s", 0.0)))
        return frame
