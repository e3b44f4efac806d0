"""Rank 0's scheduler and a follower playing its step plans, joined in one process, stay in lockstep.

Rank 0 runs the real ``Scheduler`` over the real BatchGenerator and the weightless counting
model; the follower runs ``Follower`` on its own counting model and BatchGenerator, on a
thread, fed by an in-process link that carries frames and rank 0's input tokens as the ring
backend would. The counting model's KV at each position is the token fed there, so the
follower's cache entries equal rank 0's exactly when it ran the same batch on the same
tokens: that is checked after cancels, stop tokens and strings, prefix hits, evictions and
concurrent prompts. The follower's model predicts differently on purpose: it must never
sample its own tokens.
"""

from __future__ import annotations

import json
import queue
import threading

import mlx.core as mx
import numpy as np
import pytest

from tests.unit.engine.scheduler_fakes import EOS, CountingModel, FakeClock, Harness, counting
from vllmmlxd.engine.batch.step_plan import Drop, Extract, Finish, Join, Keep, Leave, StepPlan, from_wire, to_wire
from vllmmlxd.engine.cache.block_cache import BlockCache
from vllmmlxd.engine.distributed.follow import Diverged, Follower
from vllmmlxd.engine.distributed.lockstep import (
    FRAME_BYTES,
    Frame,
    FrameError,
    Kind,
    Leader,
    decode,
    encode,
    overflow_length,
)


class _Hub:
    def __init__(self) -> None:
        self.frames: queue.Queue = queue.Queue()
        self.tokens: queue.Queue = queue.Queue()
        self.reports: queue.Queue = queue.Queue()
        self.report = b"\0" * FRAME_BYTES


class LeaderLink:
    rank, world = 0, 2

    def __init__(self, hub: _Hub):
        self.hub = hub

    def lead(self, frame: bytes, overflow: bytes) -> None:
        # As the all_gather: rank 0 sends its frame and gets what the follower sent with it.
        assert len(frame) == FRAME_BYTES and overflow_length(frame) == len(overflow)
        self.hub.frames.put((frame, overflow))
        self.hub.report = self.hub.reports.get(timeout=30)

    def reports(self) -> list[bytes]:
        return [self.hub.report]

    def broadcast(self, x: mx.array) -> mx.array:
        self.hub.tokens.put(np.array(x))
        return x


class FollowerLink:
    rank, world = 1, 2

    def __init__(self, hub: _Hub):
        self.hub = hub

    def follow(self, report: bytes) -> tuple[bytes, bytes]:
        self.hub.reports.put(report)
        return self.hub.frames.get(timeout=30)

    def broadcast(self, x: mx.array) -> mx.array:
        got = self.hub.tokens.get(timeout=30)
        assert got.shape == x.shape  # the same forward call, on the same batch
        return mx.array(got, dtype=x.dtype)


class WrongModel(CountingModel):
    """Predicts last token + 2: a rank whose own sampling would go astray."""

    def __call__(self, inputs, cache=None):
        return mx.roll(super().__call__(inputs, cache), 1, axis=-1)


class Pair:
    """Rank 0's harness and a follower playing its plans on a thread."""

    def __init__(self, **harness):
        hub = _Hub()
        self.h = Harness(lockstep=Leader(LeaderLink(hub)), **harness)
        self.follower = Follower(WrongModel(FakeClock()), self.h.options, FollowerLink(hub))
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._follow, daemon=True)
        self.thread.start()

    def _follow(self) -> None:
        try:
            self.follower.run()
        except BaseException as exc:  # reported to the test
            self.error = exc

    def close(self) -> None:
        self.h.scheduler.shutdown()  # sends STOP after the last ops
        self.thread.join(timeout=30)
        assert not self.thread.is_alive()
        if self.error is not None:
            raise self.error

    def assert_same_cache(self) -> None:
        cache = self.h.scheduler.cache
        if isinstance(cache, BlockCache):
            blocks = {n.id: n.payload for n in cache.tree.nodes.values()}
            assert blocks and set(self.follower.shadow) == set(blocks)
            for key, block in blocks.items():
                ours = self.follower.shadow[key]
                assert block.tokens == ours.tokens
                for a, b in zip((*block.keys, *block.values), (*ours.keys, *ours.values)):
                    assert mx.array_equal(a, b).item()
            return
        leader = cache._entries
        assert leader and set(self.follower.shadow) == set(leader)
        for key, entry in leader.items():
            ours = self.follower.shadow[key]
            for a, b in zip(entry.cache, ours):
                assert a.offset == b.offset
                assert mx.array_equal(a.keys[..., : a.offset, :], b.keys[..., : b.offset, :]).item()


@pytest.mark.parametrize("paged", [True, False], ids=["blocks", "whole-sequences"])
def test_the_follower_holds_rank_zeros_batch_and_cache_through_everything(paged):
    pair = Pair(max_num_seqs=4, prefill_step_size=32, paged=paged)
    h = pair.h
    base = counting(1, 70)
    seqs = [
        h.submit(base + counting(200, 5), max_tokens=6),  # shares a long start with the next: one waits
        h.submit(base + counting(300, 9), max_tokens=5),
        h.submit([EOS - 4, EOS - 3], max_tokens=10),  # ends on the stop token, not max_tokens
        h.submit(counting(400, 12), max_tokens=20, stop=("<415>",)),  # ends on a stop string
        h.submit(counting(10, 120), max_tokens=30),  # cancelled while prefilling
        h.submit(counting(20, 10), max_tokens=40),  # cancelled while decoding
        *[h.submit(counting(500 + 7 * i, 3 + i), max_tokens=3 + i) for i in range(4)],
    ]
    h.step(2)
    seqs[4].request.cancelled.set()
    h.run_until(lambda: seqs[5].produced >= 2)
    seqs[5].request.cancelled.set()
    h.finish(*seqs)
    assert seqs[2].finished == "stop" and seqs[3].finished == "stop"
    assert seqs[4].finished == seqs[5].finished == "cancelled"
    # A resent conversation: a prefix hit on rank 0, copied from the follower's own entry there.
    again = h.submit(base + counting(200, 5) + list(range(71, 77)) + [9, 9], max_tokens=3)
    h.finish(again)
    assert again.progress.cached_tokens > 70
    pair.close()
    assert pair.follower.running == set()
    pair.assert_same_cache()
    assert pair.follower.steps == h.stats.steps_executed


@pytest.mark.parametrize("paged", [True, False], ids=["blocks", "whole-sequences"])
def test_evictions_and_redundant_entries_are_dropped_on_the_follower_too(paged):
    pair = Pair(max_num_seqs=2, prefill_step_size=64, cache_mb=0.004, paged=paged)  # ~130 tokens of KV
    h = pair.h
    for i in range(6):
        h.finish(h.submit(counting(40 * i, 30), max_tokens=4))
    chat = counting(300, 20)
    h.finish(h.submit(chat, max_tokens=3))
    h.finish(h.submit([*chat, 301, 302, 303, 7], max_tokens=3))  # the longer entry makes the shorter redundant
    assert h.scheduler.cache.stats.evictions > 0
    pair.close()
    pair.assert_same_cache()


def test_a_frame_round_trips_inline_and_through_the_overflow():
    small = StepPlan((Leave((1, 2), keep=True),), 64)
    raw, overflow = encode(Frame(Kind.STEP, 7, to_wire(small)))
    assert len(raw) == FRAME_BYTES and overflow == b""
    assert (decode(raw).kind, decode(raw).seq, from_wire(decode(raw).body)) == (Kind.STEP, 7, small)
    big = StepPlan((Join(3, tuple(range(5000)), 0, (), 16),), None)
    raw, overflow = encode(Frame(Kind.IDLE, 8, to_wire(big)))
    assert overflow_length(raw) == len(overflow) > FRAME_BYTES
    assert from_wire(decode(raw, overflow).body) == big


def test_a_plan_round_trips_through_its_wire_form_with_every_kind_of_change():
    plan = StepPlan(
        (
            Join(4, (5, 6, 7), 64, (11, 12), 32),
            Leave((4,), keep=True),
            Extract((2, 3)),
            Finish((9,)),
            Keep(4, ((11, 0, 32), (12, 32, 64))),
            Drop(7),
        ),
        96,
    )
    assert from_wire(json.loads(json.dumps(to_wire(plan)))) == plan
    with pytest.raises(ValueError, match="join: 2 fields, not 5"):
        from_wire({"changes": [["join", 1, 2]], "chunk": None})
    with pytest.raises(ValueError, match="not a step plan"):
        from_wire({"chunk": 8})


def test_a_damaged_or_foreign_frame_is_an_error_not_a_guess():
    raw, _overflow = encode(Frame(Kind.STEP, 1, to_wire(StepPlan((), 8))))
    damaged = bytearray(raw)
    damaged[40] ^= 0xFF
    with pytest.raises(FrameError, match="damaged"):
        decode(bytes(damaged))
    with pytest.raises(FrameError, match="not a vllmmlxd frame"):
        decode(b"\0" * FRAME_BYTES)
    with pytest.raises(FrameError, match="8192 bytes"):
        decode(raw[:100])


def test_a_plan_that_does_not_fit_the_followers_batch_stops_it():
    hub = _Hub()
    follower = Follower(CountingModel(FakeClock()), Harness().options, FollowerLink(hub))
    join = Join(uid=0, tokens=(1, 2, 3), cached=2, source=(41,), max_tokens=4)
    hub.frames.put(encode(Frame(Kind.IDLE, 1, to_wire(StepPlan((join,), None)))))
    with pytest.raises(Diverged, match=r"pieces \[41\] are not here"):
        follower.follow_one()
    hub.frames.put(encode(Frame(Kind.IDLE, 5, to_wire(StepPlan((), None)))))
    with pytest.raises(Diverged, match="frame 5 after frame 1"):
        follower.follow_one()


def test_a_frame_that_is_no_plan_stops_it():
    hub = _Hub()
    follower = Follower(CountingModel(FakeClock()), Harness().options, FollowerLink(hub))
    hub.frames.put(encode(Frame(Kind.STEP, 1, {"changes": [["teleport", 3]], "chunk": 8})))
    with pytest.raises(FrameError, match="unknown change 'teleport'"):
        follower.follow_one()


class _StaleLink(LeaderLink):
    """A follower that stopped answering: its share of the gather is stale or empty."""

    def __init__(self, reports: list[bytes]):
        self._canned = reports

    def lead(self, frame: bytes, overflow: bytes) -> None:
        pass

    def reports(self) -> list[bytes]:
        return self._canned


def test_rank_zero_notices_a_rank_that_did_not_answer_the_frame():
    leader = Leader(_StaleLink([encode(Frame(Kind.REPORT, 0, {}))[0]]))
    leader.idle(StepPlan((), None))  # frame 1, answered after frame 0: fine
    with pytest.raises(FrameError, match="rank 1 answered frame 2 with report 0"):
        leader.idle(StepPlan((), None))  # a buffer that still holds an old report
    with pytest.raises(FrameError, match="not a vllmmlxd frame"):
        Leader(_StaleLink([b"\0" * FRAME_BYTES])).step(StepPlan((), 64))  # nothing arrived
