"""Frames between ranks over the distributed group's own collectives (ring, jaccl).

Every frame is one ``all_gather`` of a fixed-size byte array per rank, on the generation
stream, so it is ordered with the forward passes' own collectives; a long body follows as one
``all_sum`` of exactly its length (the other ranks add zeros).

Rank 0 waits for each frame, which waits for the forward pass queued before it: a collective
evaluated asynchronously fails silently when a peer is gone (its output holds whatever the
buffer held), while a waited-for one raises. So a lost rank is noticed at the next frame,
before the tokens of the step it broke are read. The cost is the time rank 0 spends building
the next step's graph while the device waits.
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
        self._reports: list[bytes] = []  # rank 0: what the other ranks sent with the last frame

    def _gather(self, mine: bytes) -> mx.array:
        return mx.distributed.all_gather(mx.array(np.frombuffer(mine, dtype=np.uint8)), group=self.group)

    def lead(self, frame: bytes, overflow: bytes) -> None:
        with mx.stream(generation_stream):
            gathered = self._gather(frame)
            out = [gathered]
            if overflow:
                out.append(mx.distributed.all_sum(mx.array(np.frombuffer(overflow, dtype=np.uint8)), group=self.group))
            mx.eval(out)
        got = _bytes(gathered)
        self._reports = [got[r * FRAME_BYTES : (r + 1) * FRAME_BYTES] for r in range(1, self.world)]

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
        out = mx.distributed.all_sum(x if self.rank == 0 else x * 0, group=self.group)
        # Queued now, so it runs before the forward pass's own collectives on every rank: on a
        # pipeline rank that receives its hidden state, the graph never reaches its input tokens.
        mx.async_eval(out)
        return out
