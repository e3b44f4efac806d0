"""Per-request samplers and logits processors built from :class:`SamplingParams`.

Each request owns its random key, so a seed gives the same text whatever else the
engine serves (and keeps holding once requests are batched).
"""

from __future__ import annotations

import random
from typing import Callable

import mlx.core as mx
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p, make_logits_processors

from .types import SamplingParams

Sampler = Callable[[mx.array], mx.array]
LogitsProcessor = Callable[[mx.array, mx.array], mx.array]


def make_sampler(params: SamplingParams) -> Sampler:
    """Greedy at temperature 0; otherwise filtered categorical sampling with the request's own key."""
    if params.temperature == 0:
        return lambda logprobs: mx.argmax(logprobs, axis=-1)
    seed = params.seed if params.seed is not None else random.getrandbits(63)
    state = {"key": mx.random.key(seed)}
    filters: list[Callable[[mx.array], mx.array]] = []
    if 0 < params.top_p < 1.0:
        filters.append(lambda x: apply_top_p(x, params.top_p))
    if params.min_p > 0:
        filters.append(lambda x: apply_min_p(x, params.min_p))
    if params.top_k > 0:
        filters.append(lambda x: apply_top_k(x, params.top_k))
    inv_temp = 1.0 / params.temperature

    def sample(logprobs: mx.array) -> mx.array:
        state["key"], sub = mx.random.split(state["key"])
        for f in filters:
            logprobs = f(logprobs)
        return mx.random.categorical(logprobs * inv_temp, key=sub)

    return sample


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
