"""Log-probabilities for the rows that ask for them (``SamplingParams.logprobs``), computed inside
the batch's own passes.

A request that asks gets a :class:`LogprobTap` as the first of its row's logits processors: each
time the row's next token is chosen (a decode step, the pass that ends its prompt, each position of
a speculative verify), the tap sees the model's raw logits for it, before any penalty, logit bias,
grammar mask or temperature (vLLM's default, ``raw_logprobs``), and keeps their log-softmax and
top candidates, evaluated with the pass. The token comes back from the batch one step later; the
scheduler then takes the oldest kept entry for it (``take``): positions are consumed in the
order they were computed, which is the order the row's tokens come back in. Rows that do not
ask pay nothing.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import mlx.core as mx

MAX_TOP = 20  # OpenAI's bound on top_logprobs


@dataclass(frozen=True)
class Candidate:
    """One token the model could have written at a position, with its log-probability."""

    token: int
    text: str
    logprob: float


@dataclass(frozen=True)
class TokenLogprob:
    """A written token's log-probability and the ``top`` most likely tokens at its position (most likely first)."""

    token: int
    text: str
    logprob: float
    top: tuple[Candidate, ...] = ()


class LogprobTap:
    """A logits processor that changes nothing and keeps, per position, the raw distribution's
    log-probabilities and its ``top`` candidates (``piece``: a token's text)."""

    def __init__(self, top: int, piece: Callable[[int], str]):
        self.top = min(max(top, 0), MAX_TOP)
        self.piece = piece
        self.kept: deque[tuple[mx.array, mx.array | None]] = deque()

    def __call__(self, context: mx.array, logits: mx.array) -> mx.array:
        scores = logits.astype(mx.float32)
        logprobs = (scores - mx.logsumexp(scores, axis=-1, keepdims=True)).reshape(-1)
        best = mx.argpartition(-logprobs, kth=self.top - 1)[: self.top] if self.top else None
        mx.async_eval(logprobs, *(() if best is None else (best,)))  # with the pass, not when the token is read
        self.kept.append((logprobs, best))
        return logits

    def take(self, token: int) -> TokenLogprob:
        """The entry for ``token``, the row's next token back from the batch."""
        logprobs, best = self.kept.popleft()
        top: tuple[Candidate, ...] = ()
        if best is not None:
            ids = cast(list[int], best.tolist())
            values = cast(list[float], logprobs[best].tolist())
            ranked = sorted(zip(ids, values, strict=True), key=lambda c: -c[1])
            top = tuple(Candidate(t, self.piece(t), v) for t, v in ranked)
        return TokenLogprob(token, self.piece(token), cast(float, logprobs[token].item()), top)
