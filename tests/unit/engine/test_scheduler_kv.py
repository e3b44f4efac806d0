"""The scheduler's admission by KV bytes over the real BatchGenerator and the weightless model:
requests wait for room (their place in the queue shown), room comes back when a request
finishes, is cancelled or fails, and a request that can never fit is ended, not run."""

from __future__ import annotations

import pytest

from tests.unit.engine.scheduler_fakes import KV_BYTES_PER_TOKEN, Harness, counting, decode_ids
from vllmmlxd.engine.step.kv_budget import GROWTH_STEP
from vllmmlxd.engine.types import Finished

PROMPT, MAX_TOKENS = 40, 24
WIDTH = PROMPT + MAX_TOKENS + GROWTH_STEP  # what one such request's row may reach, as the batch holds it
TWO_ROWS = 2 * WIDTH * KV_BYTES_PER_TOKEN


@pytest.fixture
def h():
    harness = Harness(max_num_seqs=8, kv_bytes=TWO_ROWS)
    yield harness
    harness.close()


def last(h: Harness, seq) -> Finished:
    event = h.events(seq)[-1]
    assert isinstance(event, Finished)
    return event


def test_a_budget_of_two_rows_runs_two_at_a_time_and_every_request_completes(h):
    seqs = [h.submit(counting(10 * i, PROMPT), max_tokens=MAX_TOKENS) for i in range(6)]
    h.step()
    assert list(h.scheduler.running.values()) == seqs[:2]
    waiting = [s.progress for s in seqs[2:]]
    assert [p.queue_position for p in waiting] == [1, 2, 3, 4]
    assert {p.waiting_for for p in waiting} == {"kv_budget"} and h.stats.kv_waiting == 4
    assert h.stats.kv_reserved_bytes == TWO_ROWS and h.stats.kv_running == 2
    snapshot = {r["request_id"]: r for r in h.stats.active_requests()}[seqs[2].request.request_id]
    assert snapshot["phase"] == "queued" and snapshot["queue_position"] == 1 and snapshot["waiting_for"] == "kv_budget"
    while not all(s.finished for s in seqs):
        assert len(h.scheduler.running) <= 2
        assert h.stats.kv_held_bytes <= h.stats.kv_reserved_bytes <= TWO_ROWS  # the buffers stay within
        h.step()
    for i, seq in enumerate(seqs):  # queued, never failed: each answers as it would alone
        assert last(h, seq).reason == "length"
        assert h.text(seq) == decode_ids(counting(10 * i + PROMPT, MAX_TOKENS))
    assert h.admitted == [s.request.request_id for s in seqs]  # in arrival order
    assert 0 < h.stats.kv_peak_held_bytes <= TWO_ROWS
    assert h.stats.kv_reserved_bytes == 0 and h.stats.kv_running == 0


def test_a_long_request_is_not_overtaken_by_shorter_ones_behind_it(h):
    first = h.submit(counting(1, PROMPT), max_tokens=MAX_TOKENS)
    long = h.submit(counting(100, PROMPT), max_tokens=MAX_TOKENS + WIDTH // 2)  # fits alone, not beside another
    short = h.submit(counting(200, 4), max_tokens=2)
    h.step()
    assert list(h.scheduler.running.values()) == [first]
    assert long.progress.waiting_for == "kv_budget" and short.progress.waiting_for == "kv_budget"
    assert short.progress.queue_position == 2
    h.run_until(lambda: long.uid is not None)
    assert first.finished and short.uid is None  # it joins after the long one, not before
    h.finish(long, short)
    assert last(h, long).reason == "length" and last(h, short).reason == "length"


def test_a_short_request_waits_beside_a_long_one_the_batch_would_pad_it_to(h):
    long = h.submit(counting(1, PROMPT), max_tokens=MAX_TOKENS + WIDTH // 2)
    short = h.submit(counting(300, 4), max_tokens=2)  # its own width is small, its row would not be
    h.step()
    assert long.uid is not None and short.uid is None and short.progress.waiting_for == "kv_budget"
    h.finish(long, short)


def test_room_comes_back_when_a_running_request_is_cancelled(h):
    a, b, c = (h.submit(counting(10 * i, PROMPT), max_tokens=MAX_TOKENS) for i in range(3))
    h.step()
    assert c.uid is None and c.progress.waiting_for == "kv_budget"
    a.request.cancelled.set()
    h.step()
    assert a.finished == "cancelled" and c.uid is not None and c.progress.queue_position is None
    h.finish(b, c)


def test_room_comes_back_when_the_batch_fails(h):
    a, b, c = (h.submit(counting(10 * i, PROMPT), max_tokens=MAX_TOKENS) for i in range(3))
    h.step()
    h.model.fail = RuntimeError("out of memory")
    h.step()
    h.model.fail = None
    assert last(h, a).reason == "error" and last(h, b).reason == "error"
    h.step()
    assert c.uid is not None  # the failed rows reserve nothing any more
    h.finish(c)
    assert last(h, c).reason == "length"


def test_a_request_that_can_never_fit_ends_with_the_numbers(h):
    # The engine refuses one at the door (400); one queued when the budget was lowered under it ends here.
    running = h.submit(counting(1, PROMPT), max_tokens=MAX_TOKENS)
    big = h.submit(counting(50, PROMPT), max_tokens=MAX_TOKENS + WIDTH)
    h.step()
    assert big.progress.waiting_for == "kv_budget"
    h.scheduler.kv = h.scheduler.kv.with_limit(WIDTH * KV_BYTES_PER_TOKEN, "max_kv_memory_mb (lowered)")
    h.step()
    finished = last(h, big)
    assert finished.reason == "error" and finished.error_kind == "kv_budget"
    assert f"{PROMPT} prompt + {MAX_TOKENS + WIDTH:,} max_tokens tokens" in (finished.error or "")
    assert "max_kv_memory_mb (lowered)" in (finished.error or "")
    h.finish(running)
    assert last(h, running).reason == "length"


def test_no_budget_admits_by_rows_alone():
    h = Harness(max_num_seqs=3)
    seqs = [h.submit(counting(10 * i, PROMPT), max_tokens=MAX_TOKENS) for i in range(4)]
    h.step()
    assert len(h.scheduler.running) == 3 and seqs[3].progress.waiting_for == "max_num_seqs"
    assert seqs[3].progress.queue_position == 1
    h.finish(*seqs)
    h.close()


def test_a_prefix_hit_reserves_the_whole_prompt_too(h):
    first = h.submit(counting(1, PROMPT), max_tokens=MAX_TOKENS)
    h.finish(first)
    again = h.submit(counting(1, PROMPT), max_tokens=MAX_TOKENS)
    h.step()
    assert again.progress.cached_tokens > 0
    # The hit is the request's own copy: the row reaches the same width as without it.
    assert h.stats.kv_reserved_bytes == WIDTH * KV_BYTES_PER_TOKEN
    h.finish(again)
