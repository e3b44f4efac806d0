"""A rank other than 0: plays rank 0's step plans on its own share of the model.

Each frame carries a plan (``step_plan``); its changes and its pass run through the same
``Batch`` calls rank 0 made (``batch.FollowerBatch.play``), and the pass's forward runs the
model's collectives with the other ranks. Nothing here decides: a plan that does not fit this
rank's state means the ranks disagree, and the rank exits (its worker is restarted as a whole).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from .batch import Diverged, FollowerBatch, Mirror, make_generator
from .cache_setup import make_kv_ops
from .lockstep import FollowRankZero, Frame, FrameError, Kind, Link, decode, encode
from .options import EngineOptions
from .step_plan import from_wire

__all__ = ["Diverged", "Follower"]


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
