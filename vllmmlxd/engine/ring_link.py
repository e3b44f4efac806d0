"""Frames between ranks over the distributed group's own collectives (ring, jaccl).

Every frame is one ``all_gather`` of a fixed-size byte array per rank, on the generation
stream, so it is ordered with the forward passes' own collectives; a long body follows as one
``all_sum`` of exactly its length (the other ranks add zeros). Rank 0 does not wait for a
frame: the other ranks' reports are read one frame later, when it has long arrived.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
from mlx_lm.generate import generation_stream

from .lockstep import FRAME_BYTES, overflow_length


def _bytes(a: mx.array) -> bytes:
    return np.array(a, copy=False).tobytes()


class RingLink:
    def __init__(self, group: mx.distributed.Group):
        self.group = group
        self.rank, self.world = group.rank(), group.size()
        self._gathered: mx.array | None = None  # rank 0: the last frame's all_gather, in flight
        self._reports: list[bytes] = []

    def _gather(self, mine: bytes) -> mx.array:
        return mx.distributed.all_gather(mx.array(np.frombuffer(mine, dtype=np.uint8)), group=self.group)

    def lead(self, frame: bytes, overflow: bytes) -> None:
        if self._gathered is not None:  # the previous frame: done by now (the stream runs in order)
            got = _bytes(self._gathered)
            self._reports = [got[r * FRAME_BYTES : (r + 1) * FRAME_BYTES] for r in range(1, self.world)]
        with mx.stream(generation_stream):
            gathered = self._gather(frame)
            out = [gathered]
            if overflow:
                out.append(mx.distributed.all_sum(mx.array(np.frombuffer(overflow, dtype=np.uint8)), group=self.group))
            mx.async_eval(out)
        self._gathered = gathered

    def follow(self, report: bytes) -> tuple[bytes, bytes]:
        with mx.stream(generation_stream):
            gathered = self._gather(report)
            mx.eval(gathered)
            frame = _bytes(gathered[:FRAME_BYTES])
            n = overflow_length(frame)
            overflow = b""
            if n:
                summed = mx.distributed.all_sum(mx.zeros((n,), dtype=mx.uint8), group=self.group)
                mx.eval(summed)
                overflow = _bytes(summed)
        return frame, overflow

    def reports(self) -> list[bytes]:
        return list(self._reports)

    def broadcast(self, x: mx.array) -> mx.array:
        return mx.distributed.all_sum(x if self.rank == 0 else x * 0, group=self.group)
