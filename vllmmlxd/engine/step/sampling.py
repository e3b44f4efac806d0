"""Per-request samplers and logits processors built from :class:`SamplingParams`.

Each request owns its random key, so a seed gives the same text whatever else the
engine serves (and keeps holding once requests are batched).
"""

from __future__ import annotations

import random
from collections.abc import Callable

import mlx.core as mx
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p, make_logits_processors

from ..types import SamplingParams

Sampler = Callable[[mx.array], mx.array]
LogitsProcessor = Callable[[mx.array, mx.array], mx.array]


def make_sampler(params: SamplingParams) -> RequestSampler:
    """Greedy at temperature 0; otherwise filtered categorical sampling with the request's own key."""
    return RequestSampler(params)


class RequestSampler:
    """One request's sampler, called as mlx-lm's batch calls a sampler (logprobs in, a token out).

    The k-th token a request samples is drawn with a key made from its seed and k alone (the
    Gumbel noise of that position), not from a key stream advanced by each draw. So the token
    at a position does not depend on how it was reached: speculation (``engine.speculative``)
    asks ``at(logprobs, k)`` for the token the request would sample there and keeps a draft only
    when it is that token, so a seeded request gives the same text with or without it, and
    whatever drafts a step verified."""

    def __init__(self, params: SamplingParams):
        self.greedy = params.temperature == 0
        self.seed = params.seed if params.seed is not None else random.getrandbits(63)
        self.drawn = 0  # tokens sampled so far: the next call samples position ``drawn``
        self._filters: list[Callable[[mx.array], mx.array]] = []
        if 0 < params.top_p < 1.0:
            self._filters.append(lambda x: apply_top_p(x, params.top_p))
        if params.min_p > 0:
            self._filters.append(lambda x: apply_min_p(x, params.min_p))
        if params.top_k > 0:
            self._filters.append(lambda x: apply_top_k(x, params.top_k))
        self._inv_temp = 1.0 / params.temperature if params.temperature else 0.0

    def __call__(self, logprobs: mx.array) -> mx.array:
        if self.greedy:
            return mx.argmax(logprobs, axis=-1)
        token = self.at(logprobs, self.drawn)
        self.drawn += 1
        return token

    def at(self, logprobs: mx.array, position: int) -> mx.array:
        """The token this request samples at ``position`` (its 0-based count of generated tokens)."""
        if self.greedy:
            return mx.argmax(logprobs, axis=-1)
        for f in self._filters:
            logprobs = f(logprobs)
        # Python hashes tuples of ints the same in every process: one key per (seed, position).
        key = mx.random.key(hash((self.seed, position)) & (2**63 - 1))
        return mx.random.categorical(logprobs * self._inv_temp, key=key)


def row_processors(
    params: SamplingParams, *, tap: LogitsProcessor | None = None, grammar: LogitsProcessor | None = None
) -> list[LogitsProcessor]:
    """A row's logits processors in the order they must run: the log-probability tap first (it
    reads the raw logits: ``logprobs.LogprobTap``), then bias and penalties, the grammar last (a
    logit bias after its mask could re-enable a forbidden token)."""
    return [*([tap] if tap is not None else []), *make_processors(params), *([grammar] if grammar is not None else [])]


def make_processors(params: SamplingParams) -> list[LogitsProcessor]:
    """Logit bias and repetition penalty (mlx-lm's), presence/frequency over generated tokens only."""
    processors = make_logits_processors(
        logit_bias=dict(params.logit_bias) or None,
        repetition_penalty=params.repetition_penalty if params.repetition_penalty != 1.0 else None,
        repetition_context_size=64,
    )
    if params.presence_penalty or params.frequency_penalty:
        processors.append(OutputPenalty(params.presence_penalty, params.frequency_penalty))
    return processors


class OutputPenalty:
    """OpenAI's presence and frequency penalties: over what this request wrote, not its prompt.

    It counts tokens as they come instead of slicing the context at the prompt's length,
    because the context a processor sees may start with a cached prefix or be a batch's
    view. Called once per step; from the second call on, the context ends with the token
    sampled at the previous step.
    """

    def __init__(self, presence: float, frequency: float):
        self.presence = presence
        self.frequency = frequency
        self.counts: mx.array | None = None
        self.calls = 0

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        if self.calls:
            if self.counts is None:
                self.counts = mx.zeros((logits.shape[-1],), dtype=logits.dtype)
            self.counts = self.counts.at[tokens[-1:]].add(1)
        self.calls += 1
        if self.counts is None:
            return logits
        return logits - self.frequency * self.counts - self.presence * (self.counts > 0).astype(logits.dtype)
