"""A stand-in model the real BatchGenerator drives, and a harness that steps the scheduler by hand.

The model has no weights: the next token is always ``(last token + 1) % VOCAB``, the KV it
stores at a position is that position's token id (so a cached entry can be read back and
compared with its tokens), every call's shape is recorded, and each call advances a fake
clock by ``per_call + per_token * tokens``, as a real prefill costs. The scheduler is timed
with that clock, so chunk sizes and step times are decided by construction, not by the
machine the tests run on.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from typing import Any, cast

import mlx.core as mx
import numpy as np
from mlx import nn

from vllmmlxd.engine.batch.plans import Lockstep
from vllmmlxd.engine.options import EngineOptions, SpeculationOptions
from vllmmlxd.engine.step.scheduler import Scheduler
from vllmmlxd.engine.step.sequence import Sequence
from vllmmlxd.engine.text.detokenize import IncrementalDetokenizer
from vllmmlxd.engine.types import (
    EngineEvent,
    EngineStats,
    GenerationRequest,
    ImageSpan,
    SamplingParams,
)

VOCAB = 512
EOS = VOCAB - 1
HEAD_DIM = 2
KV_BYTES_PER_TOKEN = 2 * 1 * HEAD_DIM * 4 * 2  # two layers, one head, keys and values in float32


class FakeClock:
    """Seconds that pass only when the fake model works."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class CountingModel(nn.Module):
    """Next token = last token + 1; KV = the token ids; calls recorded and charged to a fake clock."""

    def __init__(self, clock: FakeClock, *, per_call: float = 0.02, per_token: float = 0.001, layers: int = 2):
        super().__init__()
        self.layers = [nn.Identity() for _ in range(layers)]  # make_prompt_cache counts them
        self._clock, self._per_call, self._per_token = clock, per_call, per_token
        self.calls: list[tuple[int, int]] = []  # (batch rows, tokens per row) of every forward pass
        self.fail: Exception | None = None  # raised by the next call, as an out-of-memory would be
        self.on_call: Callable[[int, int], None] = lambda rows, tokens: None

    def __call__(self, inputs: mx.array | None, cache: list | None = None, input_embeddings=None) -> mx.array:
        if input_embeddings is not None:  # a vision prompt's prefill: the embedding is the "token" (FakeVision)
            inputs = input_embeddings[..., 0].astype(mx.int32)
        assert inputs is not None
        rows, tokens = inputs.shape
        self.calls.append((rows, tokens))
        self.on_call(rows, tokens)
        if self.fail is not None:
            raise self.fail
        self._clock.now += self._per_call + self._per_token * rows * tokens
        kv = mx.broadcast_to(inputs.astype(mx.float32)[:, None, :, None], (rows, 1, tokens, HEAD_DIM))
        for layer in cache or []:
            layer.update_and_fetch(kv, kv)
        following = (inputs + 1) % VOCAB
        return mx.where(following[..., None] == mx.arange(VOCAB), 0.0, -1e9)

    def prefill_calls(self) -> list[int]:
        """Tokens per row of the calls that were prefill chunks (a decode step feeds one token)."""
        return [tokens for _, tokens in self.calls if tokens > 1]


PLACEHOLDER = 500  # an image's tokens in a prompt (below EOS, above what counting() makes)


class FakeVision:
    """A weightless vision model: a token's embedding is its id, and an image's features at its
    placeholders are its ``pixel_values``' first number (so the KV shows which image went where).
    Every ``get_input_embeddings`` call is recorded; ``fail`` is raised by the next one."""

    def __init__(self) -> None:
        self.language_model = self
        self.calls: list[int] = []  # the marker of each image run through the tower
        self.fail: Exception | None = None

    def embed_tokens(self, ids: mx.array) -> mx.array:
        return ids.astype(mx.float32)[..., None]

    def get_input_embeddings(self, ids: mx.array, pixel_values: mx.array, **kwargs):
        if self.fail is not None:
            raise self.fail
        marker = pixel_values.reshape(-1)[0]
        self.calls.append(int(cast(int, marker.item())))
        embeddings = mx.where(ids == PLACEHOLDER, marker, ids).astype(mx.float32)[..., None]
        return type("Features", (), {"inputs_embeds": embeddings})()


def image_span(start: int, length: int, marker: int) -> ImageSpan:
    """An image at ``start`` whose features are ``marker`` (its key, as a pixels' hash, from the marker)."""
    return ImageSpan(
        start,
        length,
        hashlib.sha256(str(marker).encode()).hexdigest(),
        {"pixel_values": np.full((1, 1, 1), marker, np.float32)},
    )


def decode_ids(ids: list[int]) -> str:
    return "".join(f"<{i}>" for i in ids)


class Harness:
    """A scheduler over a CountingModel, stepped from the test's thread; events read without a running loop."""

    def __init__(
        self,
        *,
        max_num_seqs: int = 4,
        prefill_step_size: int = 64,
        cache_mb: float = 64,
        per_call: float = 0.02,
        per_token: float = 0.001,
        lockstep: Lockstep | None = None,
        model: CountingModel | None = None,
        vision: FakeVision | None = None,
        kv_bytes: int | None = None,
        paged: bool = True,
        speculative: SpeculationOptions | None = None,
        draft: Any = None,
    ):
        self.loop = asyncio.new_event_loop()
        self.clock = FakeClock()
        self.model = model or CountingModel(self.clock, per_call=per_call, per_token=per_token)
        self.stats = EngineStats()
        self.options = options = EngineOptions(
            max_num_seqs=max_num_seqs,
            prefill_step_size=prefill_step_size,
            cache_budget_bytes=int(cache_mb * 1024 * 1024),
            kv_budget_bytes=kv_bytes,
            kv_budget_source="max_kv_memory_mb" if kv_bytes is not None else "",
            paged_cache=paged,
            speculative=speculative,
        )
        self.scheduler = Scheduler(self.model, {EOS}, options, self.stats, lockstep, vision=vision, draft=draft)
        self.model.calls.clear()  # the load's own passes (speculation's verify probe) are no request's
        self.scheduler.clock = self.clock
        self.admitted: list[str] = []  # request ids, in the order they left the queue
        self.scheduler.on_admit = lambda seq: self.admitted.append(seq.request.request_id)
        self._events: dict[int, list[EngineEvent]] = {}

    def submit(
        self, prompt: list[int], max_tokens: int = 4, images: tuple[ImageSpan, ...] = (), **sampling
    ) -> Sequence:
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, **sampling)
        request = GenerationRequest(list(prompt), params, images=images)
        seq = Sequence(request, self.loop, IncrementalDetokenizer(decode_ids, request.prompt_tokens), {EOS}, set())
        self.stats.requests[request.request_id] = seq.progress  # as MLXEngine.generate does
        self.scheduler.inbox.put(seq)
        return seq

    def step(self, times: int = 1) -> None:
        for _ in range(times):
            assert self.scheduler.step()

    def run_until(self, done: Callable[[], bool], limit: int = 500) -> int:
        """Step until ``done()``; returns the steps it took."""
        for n in range(limit):
            if done():
                return n
            self.step()
        raise AssertionError(f"not done after {limit} steps")

    def finish(self, *seqs: Sequence) -> None:
        self.run_until(lambda: all(s.finished for s in seqs))

    def events(self, seq: Sequence) -> list[EngineEvent]:
        """Every event posted to ``seq`` so far (runs the loop's pending callbacks)."""
        self.loop.call_soon(self.loop.stop)
        self.loop.run_forever()
        got = self._events.setdefault(id(seq), [])
        while not seq.events.empty():
            got.append(seq.events.get_nowait())
        return got

    def text(self, seq: Sequence) -> str:
        return "".join(getattr(e, "text", "") for e in self.events(seq))

    def close(self) -> None:
        self.loop.close()


def counting(start: int, n: int) -> list[int]:
    """``n`` prompt tokens from ``start`` on, kept below EOS."""
    return [(start + i) % (VOCAB - 2) for i in range(n)]
