"""Finished sequences go into the block cache a few blocks a step, oldest first, and all at once
when asked (a request waiting, an idle engine); a failing insert drops that sequence only."""

from __future__ import annotations

from vllmmlxd.engine.step.store_queue import StoreQueue


def test_each_step_inserts_a_few_more_blocks_of_the_oldest_sequence_first():
    calls: list[tuple[str, int]] = []
    queue = StoreQueue(lambda key, cache, captures: calls.append((cache, len(key))), block=4, blocks=2)
    queue.add(list(range(19)), "first")  # 4 blocks and 3 positions
    queue.add(list(range(6)), "second")
    queue.advance()
    queue.advance()
    assert calls == [("first", 8), ("first", 16)]  # two blocks a step: each call a longer prefix
    queue.advance()
    assert calls[2:] == [("first", 19), ("second", 4)]  # its last (partial) block, and one of the next
    queue.advance()
    assert calls[4:] == [("second", 6)] and len(queue) == 0


def test_everything_at_once_when_asked_and_a_failure_drops_only_that_sequence():
    calls: list[tuple[str, int]] = []

    def insert(key, cache, captures):
        calls.append((cache, len(key)))
        if cache == "broken":
            raise RuntimeError("no room")

    queue = StoreQueue(insert, block=4, blocks=1)
    queue.add(list(range(10)), "broken")
    queue.add(list(range(30)), "whole")
    queue.advance()  # one block of the broken one: it fails, and is dropped
    assert calls == [("broken", 4)] and len(queue) == 1
    queue.advance(everything=True)
    assert calls[1:] == [("whole", 30)] and len(queue) == 0


def test_a_sequence_finishing_beside_a_stream_is_stored_over_several_steps_and_a_newcomer_gets_all_of_it():
    from tests.unit.engine.scheduler_fakes import Harness, counting

    h = Harness(prefill_step_size=512)
    block = h.scheduler.cache.block
    stream = h.submit(counting(1, 8), max_tokens=200)
    long = h.submit(counting(100, block * 40), max_tokens=2)
    h.finish(long)
    stores = h.scheduler.stores
    assert stores is not None and len(stores) == 1  # its KV waits, while the stream runs
    held = [len(h.scheduler.cache.tree.nodes)]
    while len(stores):
        h.step()
        held.append(len(h.scheduler.cache.tree.nodes))
    assert len(held) > 3 and held == sorted(held)  # a few blocks a step
    again = h.submit([*counting(100, block * 40), 7, 7], max_tokens=1)
    h.finish(again)
    assert again.progress.cached_tokens >= block * 40 - block
    other = h.submit(counting(300, block * 40), max_tokens=2)
    h.finish(other)
    assert len(stores) == 1
    soon = h.submit([*counting(300, block * 40), 7, 7], max_tokens=1)  # arrives while it is being stored
    h.finish(soon)
    assert soon.progress.cached_tokens >= block * 40 - block  # the rest went in before it was admitted
    assert not stream.finished
    h.close()
