"""scheduler.py over the real BatchGenerator and a weightless model: admission, cancellation,
the prefix wait, the error path, and the engine thread's loop."""

from __future__ import annotations

import asyncio
import threading

import mlx.core as mx
import pytest

from tests.unit.engine.scheduler_fakes import EOS, Harness, counting, decode_ids
from vllmmlxd.engine.types import Constraint, Finished


@pytest.fixture
def h():
    harness = Harness()
    yield harness
    harness.close()


def finished(h: Harness, seq) -> Finished:
    last = h.events(seq)[-1]
    assert isinstance(last, Finished)
    return last


def left_the_batch(h: Harness) -> bool:
    """Nothing is left in the generator: a new request runs alone (one row in every call)."""
    calls = len(h.model.calls)
    seq = h.submit(counting(400, 6), max_tokens=3)
    h.finish(seq)
    return h.text(seq) == decode_ids([406, 407, 408]) and all(rows == 1 for rows, _ in h.model.calls[calls:])


def cached_tokens_of(h: Harness, tokens: list[int]) -> tuple[int, str, list[int]]:
    """What the prefix cache would give a prompt that continues ``tokens``: (count, hit type, the KV's ids)."""
    hit = h.scheduler.cache.lookup([*tokens, 7])
    ids = hit.cache[0].keys[0, 0, : hit.cached_tokens, 0].astype(mx.int32).tolist() if hit.cache else []
    return hit.cached_tokens, hit.hit_type, ids


# -- admission ---------------------------------------------------------------


def test_oldest_first_up_to_max_num_seqs_and_a_full_batch_waits():
    h = Harness(max_num_seqs=2)
    a, b, c = (h.submit(counting(10 * i, 8), max_tokens=3) for i in range(1, 4))
    h.step()
    assert h.admitted == [a.request.request_id, b.request.request_id]
    assert list(h.scheduler.running.values()) == [a, b] and list(h.scheduler.waiting) == [c]
    assert c.progress.phase == "queued"
    while not (a.finished and b.finished):
        assert len(h.scheduler.running) <= 2 and c.uid is None  # never a third in the batch
        h.step()
    h.finish(c)
    assert h.admitted[-1] == c.request.request_id
    assert c.progress.waiting_for is None and c.progress.waited_for == "max_num_seqs"  # what its trace shows
    assert a.progress.waited_for is None
    # Deterministic logits: each continues counting from its prompt's last token.
    assert [h.text(s) for s in (a, b, c)] == [
        decode_ids([18, 19, 20]),
        decode_ids([28, 29, 30]),
        decode_ids([38, 39, 40]),
    ]
    assert [finished(h, s).reason for s in (a, b, c)] == ["length"] * 3
    assert finished(h, c).usage.prompt_tokens == 8 and finished(h, c).usage.completion_tokens == 3
    assert h.stats.total_requests_processed == 3 and not h.stats.requests


def test_continuous_batching_off_serves_one_at_a_time():
    h = Harness(max_num_seqs=1)
    a, b = h.submit(counting(1, 4), max_tokens=2), h.submit(counting(50, 4), max_tokens=2)
    h.step()
    assert list(h.scheduler.running.values()) == [a] and list(h.scheduler.waiting) == [b]
    h.finish(a, b)
    assert h.text(b) == decode_ids([54, 55])


def test_an_eos_token_stops_a_request():
    h = Harness()
    seq = h.submit([EOS - 3, EOS - 2], max_tokens=10)  # EOS - 1, then EOS
    h.finish(seq)
    assert finished(h, seq).reason == "stop" and h.text(seq) == decode_ids([EOS - 1])


# -- cancellation -------------------------------------------------------------


def test_a_cancelled_waiting_request_never_reaches_the_model():
    h = Harness(max_num_seqs=1)
    a, b = h.submit(counting(1, 8), max_tokens=20), h.submit(counting(100, 300), max_tokens=20)
    h.step()
    assert b in h.scheduler.waiting
    b.request.cancelled.set()
    h.step()
    assert b.finished == "cancelled" and b not in h.scheduler.waiting and b.uid is None
    assert h.admitted == [a.request.request_id, b.request.request_id]  # it left the queue: the count is freed
    assert [type(e) for e in h.events(b)] == [Finished] and finished(h, b).usage.completion_tokens == 0
    assert all(tokens < 300 for _, tokens in h.model.calls)  # its 300-token prompt was never fed
    assert b.request.request_id not in h.stats.requests
    h.finish(a)
    assert cached_tokens_of(h, counting(100, 300))[0] == 0  # nothing of it in the cache


def test_a_request_cancelled_while_prefilling_leaves_the_batch_and_caches_nothing(h):
    seq = h.submit(counting(1, 200), max_tokens=10)
    h.step(2)
    assert seq.progress.phase == "prefill" and 0 < seq.progress.prefilled_tokens < 200
    calls = len(h.model.calls)
    seq.request.cancelled.set()
    h.step()
    assert seq.finished == "cancelled" and not h.scheduler.running
    assert len(h.model.calls) == calls  # not one more chunk
    assert len(h.scheduler.cache) == 0  # a half-prefilled prompt is not kept
    assert left_the_batch(h)


def test_a_request_cancelled_after_its_first_token_leaves_its_kv_in_the_cache(h):
    prompt = counting(1, 40)
    seq = h.submit(prompt, max_tokens=50)
    h.run_until(lambda: seq.produced >= 3)
    seq.request.cancelled.set()
    h.step()
    assert seq.finished == "cancelled" and not h.scheduler.running
    generated = list(range(41, 41 + seq.produced))
    count, kind, ids = cached_tokens_of(h, prompt + generated)
    # The whole sequence so far, prompt and answer, with the KV of exactly those tokens.
    assert (count, kind) == (len(prompt) + len(generated), "prefix") and ids == prompt + generated
    assert finished(h, seq).usage.completion_tokens == seq.produced
    assert left_the_batch(h)


# -- the prefix wait ----------------------------------------------------------


def test_a_prompt_sharing_a_long_start_waits_for_its_prefill_then_hits_the_cache():
    h = Harness(prefill_step_size=16)
    shared = counting(1, 80)
    leader, follower = (
        h.submit(shared + counting(200, 20), max_tokens=3),
        h.submit(shared + counting(300, 10), max_tokens=3),
    )
    h.step()
    assert leader.uid is not None and follower in h.scheduler.waiting and leader.prompt_wanted
    while leader.progress.first_token_at is None:
        assert follower.uid is None  # it waits while the shared start is prefilled once
        h.step()
    h.finish(leader, follower)
    assert follower.progress.cache_hit_type == "lcp" and follower.progress.cached_tokens == 80
    assert sum(h.model.prefill_calls()) <= 100 + 10  # the shared 80 tokens were prefilled once
    assert h.text(follower) == decode_ids([310, 311, 312])


def test_a_short_shared_start_does_not_wait():
    h = Harness(prefill_step_size=16)
    shared = counting(1, 32)
    a, b = h.submit(shared + counting(200, 60)), h.submit(shared + counting(300, 60))
    h.step()
    assert a.uid is not None and b.uid is not None  # 32 tokens in common: prefilled side by side


# -- errors -------------------------------------------------------------------


def test_a_failing_step_fails_the_batch_and_the_engine_lives_on(h):
    a, b = h.submit(counting(1, 8), max_tokens=20), h.submit(counting(50, 8), max_tokens=20)
    h.run_until(lambda: a.produced >= 2 and b.produced >= 2)
    h.model.fail = RuntimeError("[metal::malloc] out of memory")
    h.step()
    for seq in (a, b):
        done = finished(h, seq)
        assert done.reason == "error" and "out of memory" in done.error
    assert not h.scheduler.running and not h.stats.requests
    h.model.fail = None
    c = h.submit(counting(100, 8), max_tokens=3)
    h.finish(c)
    assert finished(h, c).reason == "length" and h.text(c) == decode_ids([108, 109, 110])


def test_a_request_that_cannot_be_inserted_fails_alone(h):
    a = h.submit(counting(1, 8), max_tokens=3)
    bad = h.submit(counting(50, 8), max_tokens=3)
    bad.request.constraint = Constraint('start: "x"')  # no grammar compiler in this scheduler
    h.finish(a, bad)
    assert finished(h, bad).reason == "error" and "constrained decoding" in finished(h, bad).error
    assert finished(h, a).reason == "length" and h.text(a) == decode_ids([9, 10, 11])


# -- the thread ---------------------------------------------------------------


def test_the_engine_thread_serves_the_inbox_and_cancels_what_is_left_when_closed():
    async def main() -> tuple[list, list]:
        h = Harness(max_num_seqs=1)
        h.close()
        h.loop = asyncio.get_running_loop()  # events now arrive on this running loop
        thread = threading.Thread(target=h.scheduler.run, daemon=True)
        thread.start()
        first = h.submit(counting(1, 8), max_tokens=3)
        served = [await asyncio.wait_for(first.events.get(), 30) for _ in range(4)]  # three tokens, then Finished
        endless = h.submit(counting(1, 8), max_tokens=100_000)
        await asyncio.wait_for(endless.events.get(), 30)  # it runs
        h.scheduler.inbox.put(None)
        left: list = []
        while not left or not isinstance(left[-1], Finished):
            left.append(await asyncio.wait_for(endless.events.get(), 30))
        await asyncio.to_thread(thread.join, 30)
        assert not thread.is_alive()
        return served, left

    served, left = asyncio.run(main())
    assert "".join(e.text for e in served[:3]) == decode_ids([9, 10, 11]) and served[3].reason == "length"
    assert left[-1].reason == "cancelled"
