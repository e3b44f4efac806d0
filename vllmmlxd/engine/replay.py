"""A rank other than 0: replays rank 0's batch on its own share of the model.

Each frame's ops are applied in order to this rank's BatchGenerator and to its copies of rank
0's prefix-cache pieces (blocks, or whole entries: its own share of the KV, cut from the same
positions of the same sequences, under rank 0's ids); a STEP frame
then steps the batch, whose forward pass runs the model's collectives with the other ranks.
Nothing here decides: any op that does not fit this rank's state means the ranks disagree,
and the rank exits (its worker is restarted as a whole).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from mlx_lm.generate import BatchGenerator

from .cache_setup import make_kv_ops
from .lockstep import Frame, Kind, Link, decode, encode
from .options import EngineOptions
from .scheduler import PREFILL_BATCH


class Diverged(RuntimeError):
    """Rank 0's op does not fit this rank's batch."""


class Replay:
    def __init__(
        self, model: Any, options: EngineOptions, link: Link, *, ops: Any = None, clock: Callable = time.perf_counter
    ):
        from .lockstep import FollowRankZero

        self.link = link
        self.kv = ops or make_kv_ops(model, options, distributed=True)  # the same kind of pieces as rank 0's cache
        self.gen = BatchGenerator(
            FollowRankZero(model, link),  # type: ignore[arg-type]  # the model's own surface, wrapped
            completion_batch_size=options.max_running,
            prefill_batch_size=min(options.max_running, PREFILL_BATCH),
            prefill_step_size=options.prefill_step_size,
        )
        self.shadow: dict[int, Any] = {}  # rank 0's prefix-cache piece id -> this rank's KV of it
        self.pending: dict[int, list] = {}  # caches taken from the batch, until rank 0 says what to keep
        self.running: set[int] = set()
        self.clock = clock
        self.sleep = time.sleep
        self.seq = 0
        self.steps = 0
        self.step_s = 0.0  # the last step's time
        self.wait_s = 0.0  # the last wait for a frame
        self.pid = os.getpid()

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
        for op in frame.body.get("ops", ()):
            self.apply(op)
        if frame.kind is Kind.STEP:
            self.gen.prefill_step_size = int(frame.body["pss"])
            self.pending.clear()
            started = self.clock()
            _, responses = self.gen.next()
            self.step_s = self.clock() - started
            self.steps += 1
            for response in responses:
                if response.finish_reason is not None:  # max_tokens: the same count on every rank
                    self.running.discard(response.uid)
                    self.pending[response.uid] = response.prompt_cache
        elif frame.kind is Kind.IDLE:
            # Rank 0 has nothing to run: sleep rather than poll in the next collective.
            self.sleep(float(frame.body.get("sleep_s", 0.0)))
        return frame

    def apply(self, op: list) -> None:
        name = op[0]
        if name == "ins":
            _, uid, suffix, cached, source, max_tokens = op
            caches = None
            if source:
                missing = [i for i in source if i not in self.shadow]
                if missing:
                    raise Diverged(f"prefix-cache pieces {missing} are not here")
                caches = [self.kv.join([self.shadow[i] for i in source], cached)]
            (got,) = self.gen.insert([suffix], max_tokens=[max_tokens], caches=caches)
            if got != uid:
                raise Diverged(f"rank 0 inserted uid {uid}, this rank's batch gave {got}")
            self.running.add(uid)
        elif name == "rm":
            _, uids, keep = op
            got = self.gen.remove(uids, return_prompt_caches=keep)
            self.running.difference_update(uids)
            for uid, (cache, _tokens) in (got or {}).items():
                self.pending[uid] = cache
        elif name == "ext":
            for uid, (cache, _tokens) in self.gen.extract_cache(op[1]).items():
                self.pending[uid] = cache
        elif name == "fin":
            # Ended on rank 0 by a stop token or string: end it here too, unless max_tokens already did.
            still = [uid for uid in op[1] if uid in self.running]
            if still:
                self.apply(["rm", still, True])
        elif name == "put":
            _, uid, pieces = op
            if uid not in self.pending:
                raise Diverged(f"rank 0 kept the cache of uid {uid}, which this rank does not hold")
            cut = self.kv.cut(self.pending.pop(uid), [(start, end) for _, start, end in pieces])
            for (piece, _, _), kv in zip(pieces, cut):
                self.shadow[piece] = kv
        elif name == "drop":
            self.shadow.pop(op[1], None)
        else:
            raise Diverged(f"unknown op {name!r}")
