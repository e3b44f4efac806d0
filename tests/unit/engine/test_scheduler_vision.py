"""A vision model's prompts in the scheduler, over the real BatchGenerator and weightless models:
images are prefilled from embeddings (the KV holds each image's features at its placeholders),
chunk by chunk while other streams decode, then the prompt joins the batch; the prefix cache
knows an image by its pixels, so a resent image is a hit that skips the tower and another image
is not."""

from __future__ import annotations

import mlx.core as mx
import pytest

from tests.unit.engine.scheduler_fakes import (
    KV_BYTES_PER_TOKEN,
    PLACEHOLDER,
    FakeVision,
    Harness,
    counting,
    decode_ids,
    image_span,
)
from vllmmlxd.engine.types import Finished


@pytest.fixture
def vision():
    return FakeVision()


@pytest.fixture
def h(vision):
    harness = Harness(vision=vision, prefill_step_size=16)
    yield harness
    harness.close()


def image_prompt(marker: int, *, before: int = 5, length: int = 40, after: int = 6):
    """Text, an image of ``length`` placeholders, text; and its span."""
    prompt = counting(10, before) + [PLACEHOLDER] * length + counting(100, after)
    return prompt, (image_span(before, length, marker),)


def stored_kv(h: Harness, prompt_key: list[int]) -> list[int]:
    """The KV the prefix cache holds for a prompt continuing ``prompt_key`` (ids, as the fake model stores them)."""
    hit = h.scheduler.cache.lookup([*prompt_key, 7])
    assert hit.cache is not None
    return hit.cache[0].keys[0, 0, : hit.cached_tokens, 0].astype(mx.int32).tolist()


def test_an_image_is_prefilled_from_its_features_then_decoded_in_the_batch(h, vision):
    prompt, images = image_prompt(300)
    seq = h.submit(prompt, max_tokens=3, images=images)
    h.finish(seq)
    assert h.text(seq) == decode_ids([106, 107, 108])  # the text after the image continues as text does
    assert vision.calls == [300]
    kv = stored_kv(h, seq.prompt_key)
    assert kv[:5] == prompt[:5] and kv[5:45] == [300] * 40 and kv[45:51] == prompt[45:]
    last: Finished = h.events(seq)[-1]
    assert last.usage.prompt_tokens == len(prompt) and seq.progress.prefilled_tokens == len(prompt)


def test_the_same_image_again_is_a_cache_hit_that_skips_the_tower_and_another_is_not(h, vision):
    prompt, images = image_prompt(300)
    first = h.submit(prompt, max_tokens=2, images=images)
    h.finish(first)
    again = h.submit(prompt, max_tokens=2, images=image_prompt(300)[1])
    h.finish(again)
    assert vision.calls == [300] and again.progress.cached_tokens == len(prompt) - 1
    other = h.submit(prompt, max_tokens=2, images=image_prompt(301)[1])  # the same token ids, another picture
    h.finish(other)
    assert other.progress.cached_tokens == 5  # up to where the images differ
    assert vision.calls == [300, 301] and h.text(other) == h.text(first)
    assert stored_kv(h, other.prompt_key)[5:45] == [301] * 40


def test_images_are_prefilled_a_chunk_a_step_while_a_running_stream_keeps_decoding(h, vision):
    text = h.submit(counting(200, 4), max_tokens=40)
    h.run_until(lambda: text.produced > 0)
    prompt, images = image_prompt(300, length=120)
    seq = h.submit(prompt, max_tokens=2, images=images)
    steps = 0
    while seq.uid is None:  # prefilled from embeddings, outside the batch
        before = text.produced
        h.step()
        steps += 1
        assert text.produced == before + 1  # the running stream got its token in every step
        assert seq.progress.prefilled_tokens <= len(prompt)
    assert steps >= 3  # 125 positions at no more than the step's chunk of 16 each... in several steps
    h.finish(seq, text)
    assert vision.calls == [300]


def test_two_images_each_get_their_own_features(h, vision):
    prompt = counting(10, 3) + [PLACEHOLDER] * 8 + counting(50, 2) + [PLACEHOLDER] * 8 + counting(60, 3)
    seq = h.submit(prompt, max_tokens=2, images=(image_span(3, 8, 301), image_span(13, 8, 302)))
    h.finish(seq)
    kv = stored_kv(h, seq.prompt_key)
    assert kv[3:11] == [301] * 8 and kv[11:13] == prompt[11:13] and kv[13:21] == [302] * 8


def test_a_cancelled_image_prompt_leaves_before_the_batch_and_keeps_nothing(h, vision):
    prompt, images = image_prompt(300, length=120)
    seq = h.submit(prompt, max_tokens=2, images=images)
    h.step()
    assert seq.uid is None and h.scheduler.staged
    seq.request.cancelled.set()
    h.step()
    assert not h.scheduler.staged and h.events(seq)[-1].reason == "cancelled"
    assert h.scheduler.cache.lookup([*seq.prompt_key, 1]).cached_tokens == 0


def test_an_image_that_fails_in_the_tower_fails_its_request_alone(h, vision):
    text = h.submit(counting(200, 4), max_tokens=6)
    vision.fail = RuntimeError("bad pixels")
    prompt, images = image_prompt(300)
    seq = h.submit(prompt, max_tokens=2, images=images)
    h.finish(seq, text)
    last = h.events(seq)[-1]
    assert last.reason == "error" and "bad pixels" in (last.error or "")
    assert h.events(text)[-1].reason == "length" and h.text(text) == decode_ids(list(range(204, 210)))


def test_new_images_arriving_together_go_through_the_tower_one_a_step(h, vision):
    text = h.submit(counting(200, 4), max_tokens=60)
    h.run_until(lambda: text.produced > 0)
    seqs = []
    for marker in (301, 302, 303):
        prompt, images = image_prompt(marker, length=8)
        seqs.append(h.submit(prompt, max_tokens=2, images=images))
    while not all(s.finished for s in seqs):
        calls, produced = len(vision.calls), text.produced
        h.step()
        assert len(vision.calls) <= calls + 1  # one image's tower a step at most
        assert text.produced == produced + 1  # and the running stream still got its token
    assert sorted(vision.calls) == [301, 302, 303]


def test_a_prompt_prefilled_from_embeddings_reserves_its_kv_too(vision):
    # Room for one row: while the image prompt is staged (outside the batch), a text prompt waits.
    prompt, images = image_prompt(300)
    h = Harness(vision=vision, prefill_step_size=16, kv_bytes=(len(prompt) + 3 + 256) * KV_BYTES_PER_TOKEN)
    try:
        staged = h.submit(prompt, max_tokens=3, images=images)
        h.step()
        assert h.scheduler.staged and staged.uid is None
        text = h.submit(counting(200, 8), max_tokens=3)
        h.step()
        assert text.uid is None and text.progress.waiting_for == "kv_budget" and h.stats.kv_running == 1
        h.finish(staged, text)
        assert h.text(staged) == decode_ids([106, 107, 108]) and h.text(text) == decode_ids([208, 209, 210])
    finally:
        h.close()
