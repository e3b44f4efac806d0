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
from typing import Any, cast

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

MAX_TOP = 20  # OpenAI's bound on top_logprobs
PROMPT_CHUNK = 256  # prompt positions whose log-softmax is held at once (x the vocabulary: ~40-150 MB)


@dataclass(frozen=True)
class Candidate:
    """One token the model could have written at a position, with its log-probability."""

    token: int
    text: str
    logprob: float


@dataclass(frozen=True)
class TokenLogprob:
    """A written token's log-probability and the ``top`` most likely tokens at its position (most
    likely first). A prompt's first token has neither (None): nothing comes before it."""

    token: int
    text: str
    logprob: float | None
    top: tuple[Candidate, ...] | None = ()


class LogprobTap:
    """A logits processor that changes nothing and keeps, per position, the raw distribution's
    log-probabilities and its ``top`` candidates (``piece``: a token's text)."""

    def __init__(self, top: int, piece: Callable[[int], str]):
        self.top = min(max(top, 0), MAX_TOP)
        self.piece = piece
        self.kept: deque[tuple[mx.array, mx.array | None]] = deque()

    def __call__(self, context: mx.array, logits: mx.array) -> mx.array:
        logprobs, best = scored(logits, self.top)
        mx.async_eval(logprobs, *(() if best is None else (best,)))  # with the pass, not when the token is read
        self.kept.append((logprobs[0], None if best is None else best[0]))
        return logits

    def take(self, token: int) -> TokenLogprob:
        """The entry for ``token``, the row's next token back from the batch."""
        logprobs, best = self.kept.popleft()
        return entry(logprobs, best, token, self.piece)


def scored(logits: mx.array, top: int) -> tuple[mx.array, mx.array | None]:
    """Rows of logits as log-probabilities (float32), and each row's ``top`` most likely tokens (unordered)."""
    scores = logits.astype(mx.float32)
    logprobs = scores - mx.logsumexp(scores, axis=-1, keepdims=True)
    return logprobs, mx.argpartition(-logprobs, kth=top - 1, axis=-1)[:, :top] if top else None


def entry(logprobs: mx.array, best: mx.array | None, token: int, piece: Callable[[int], str]) -> TokenLogprob:
    """``token``'s entry from one position's log-probabilities and top tokens (``scored``)."""
    top: tuple[Candidate, ...] = ()
    if best is not None:
        ids = cast(list[int], best.tolist())
        values = cast(list[float], logprobs[best].tolist())
        ranked = sorted(zip(ids, values, strict=True), key=lambda c: -c[1])
        top = tuple(Candidate(t, piece(t), v) for t, v in ranked)
    return TokenLogprob(token, piece(token), cast(float, logprobs[token].item()), top)


def prompt_logprobs(model: Any, tokens: list[int], top: int, piece: Callable[[int], str]) -> list[TokenLogprob]:
    """Each prompt token's log-probability given the tokens before it (the first has none), with its
    ``top`` candidates: one forward pass over the prompt in chunks, on a cache of its own (the
    batch's rows are untouched), holding one chunk's distributions at a time."""
    top = min(max(top, 0), MAX_TOP)
    out = [TokenLogprob(tokens[0], piece(tokens[0]), None, None)]
    cache = make_prompt_cache(model)
    for start in range(0, len(tokens) - 1, PROMPT_CHUNK):
        chunk = tokens[start : start + PROMPT_CHUNK]
        targets = tokens[start + 1 : start + 1 + len(chunk)]  # position i predicts the token after it
        logprobs, best = scored(model(mx.array([chunk]), cache=cache)[0][: len(targets)], top)
        mx.eval(logprobs, *(() if best is None else (best,)))
        out += [entry(logprobs[i], None if best is None else best[i], t, piece) for i, t in enumerate(targets)]
    return out
