"""Rank 0 decides, the other ranks follow: each step's plan, carried to every rank.

A model split over ranks runs collectives inside every forward pass, so each rank must run the
same forward calls, on the same batch, in the same order. Rank 0's scheduler alone decides
(it has the requests, the clock, the prefix cache's budget); every change it makes to its
batch is recorded (``batch.Batch``), and before each pass the changes and the pass's chunk go
to the other ranks as one ``StepPlan`` in one frame (``Link``), which they execute through the
same ``Batch`` (``follow.Follower``).

Tokens are never re-sampled on the other ranks: the model is wrapped so that each forward
pass starts from rank 0's input tokens (one ``all_sum`` in the graph, ``FollowRankZero``).
So the other ranks need no samplers, logits processors, grammars or stop strings, and ranks
whose logits differ in the last bit (two chip generations) still hold the same batch. Every
finish rank 0 sees is in the plan too (``Finish``): the other ranks end only by ``max_tokens``
on their own, which counts the same everywhere.

Frames: a fixed-size header and a JSON body; a body too long for the frame follows it in a
second collective whose length the frame gives, so every rank runs it or none does.
"""

from __future__ import annotations

import json
import struct
import time
import zlib
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Protocol

import mlx.core as mx

from ..batch.plans import IDLE_FRAME_S, Lockstep
from ..batch.step_plan import StepPlan, to_wire

FRAME_BYTES = 8192
PROTOCOL = 3  # 3: the body is a step plan (step_plan.to_wire)
_HEADER = struct.Struct("<4sBBxxIIII")  # magic, protocol, kind, seq, body length, overflow length, crc32
_MAGIC = b"VMXL"
# The other ranks sleep until just before rank 0's next idle frame (plans.IDLE_FRAME_S).
IDLE_WAKE_EARLY_S = 0.01


class Kind(IntEnum):
    STEP = 1  # a plan with a pass
    IDLE = 2  # a plan without one (a heartbeat while rank 0 has nothing to run)
    STOP = 3  # the worker is closing: exit
    REPORT = 4  # a follower's frame: what it did at the last step


class FrameError(ValueError):
    """A frame that is not one of ours, or was damaged: the ranks no longer agree."""


@dataclass(frozen=True)
class Frame:
    kind: Kind
    seq: int
    body: dict


def encode(frame: Frame) -> tuple[bytes, bytes]:
    """The fixed-size frame and the overflow (empty when the body fits)."""
    body = json.dumps(frame.body, separators=(",", ":")).encode()
    room = FRAME_BYTES - _HEADER.size
    inline, overflow = (body, b"") if len(body) <= room else (b"", body)
    header = _HEADER.pack(_MAGIC, PROTOCOL, int(frame.kind), frame.seq, len(inline), len(overflow), zlib.crc32(body))
    return (header + inline).ljust(FRAME_BYTES, b"\0"), overflow


def overflow_length(raw: bytes) -> int:
    """How long the overflow that follows this frame is (read before it is received)."""
    return _unpack(raw)[5]


def decode(raw: bytes, overflow: bytes = b"") -> Frame:
    _magic, _protocol, kind, seq, inline_len, overflow_len, crc = _unpack(raw)
    body = raw[_HEADER.size : _HEADER.size + inline_len] if inline_len else overflow[:overflow_len]
    if len(body) != (inline_len or overflow_len) or zlib.crc32(body) != crc:
        raise FrameError(f"frame {seq}: its body is damaged")
    try:
        return Frame(Kind(kind), seq, json.loads(body))
    except ValueError as exc:
        raise FrameError(f"frame {seq}: {exc}") from None


def _unpack(raw: bytes) -> tuple:
    if len(raw) != FRAME_BYTES:
        raise FrameError(f"a frame is {FRAME_BYTES} bytes, not {len(raw)}")
    fields = _HEADER.unpack_from(raw)
    if fields[0] != _MAGIC or fields[1] != PROTOCOL:
        raise FrameError("not a vllmmlxd frame of this protocol version (are the ranks' versions equal?)")
    return fields


class Link(Protocol):
    """How frames travel between ranks (the group's own collectives: ``engine/distributed/ring_link.py``)."""

    rank: int
    world: int

    def lead(self, frame: bytes, overflow: bytes) -> None:
        """Rank 0: send a frame (and its overflow) to every rank, and take their reports."""
        ...

    def follow(self, report: bytes) -> tuple[bytes, bytes]:
        """Another rank: send its report, receive rank 0's frame and overflow."""
        ...

    def reports(self) -> list[bytes]:
        """Rank 0: each other rank's report, sent with the last frame."""
        ...

    def broadcast(self, x: mx.array) -> mx.array:
        """``x`` as rank 0 has it, on every rank, as a node in the graph."""
        ...


class FollowRankZero:
    """A model whose forward pass starts from rank 0's input tokens on every rank.

    Everything else is the model's own (layers, make_cache...): the BatchGenerator and the
    prompt cache see the model they would without it.
    """

    def __init__(self, model: Any, link: Link):
        self._model, self._link = model, link

    def __call__(self, inputs: mx.array, *args: Any, **kwargs: Any) -> mx.array:
        return self._model(self._link.broadcast(inputs), *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


@dataclass
class Leader(Lockstep):
    """Rank 0's side: one frame per plan, and the other ranks' reports that come back with it."""

    link: Link
    seq: int = 0
    frames: int = 0  # frames sent
    overflow_frames: int = 0
    last_reports: dict[int, dict] = field(default_factory=dict)  # rank -> its last report

    def wrap(self, model: Any) -> Any:
        return FollowRankZero(model, self.link)

    def step(self, plan: StepPlan) -> None:
        self._send(Kind.STEP, to_wire(plan))

    def idle(self, plan: StepPlan) -> None:
        self._send(Kind.IDLE, {**to_wire(plan), "sleep_s": max(IDLE_FRAME_S - IDLE_WAKE_EARLY_S, 0.0)})

    def stop(self, plan: StepPlan) -> None:
        self._send(Kind.STOP, to_wire(plan))

    def _send(self, kind: Kind, body: dict) -> None:
        self.seq += 1
        frame, overflow = encode(Frame(kind, self.seq, body))
        self.link.lead(frame, overflow)
        self.last_frame_at = time.monotonic()
        self.frames += 1
        self.overflow_frames += bool(overflow)
        self._check_reports()

    def _check_reports(self) -> None:
        """Each other rank answered this frame having played the one before: else it is lost."""
        for rank, raw in enumerate(self.link.reports(), start=1):
            report = decode(raw)  # a FrameError: not a report at all (a lost rank's empty share)
            if report.kind is not Kind.REPORT or report.seq != self.seq - 1:
                raise FrameError(f"rank {rank} answered frame {self.seq} with report {report.seq}")
            self.last_reports[rank] = report.body

    @property
    def distributed(self) -> bool:
        return True

    def describe(self) -> dict:
        """What the other ranks last reported (their step and wait times), for /v1/status."""
        return {
            "frames": self.frames,
            "overflow_frames": self.overflow_frames,
            "followers": [self.last_reports[r] for r in sorted(self.last_reports)],
        }
