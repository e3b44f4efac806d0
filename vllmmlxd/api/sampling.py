"""Sampling asked by a request, in no API family's words, and how it meets the model's limits. Pure.

Each family maps its request onto :class:`SamplingRequest`; :func:`resolve_sampling` merges it
with the model entry's defaults. A ``max_tokens`` above the entry's ``max_request_tokens`` or
above the room left in the context is clamped, not refused: agents ask for 32k-64k by
default, and the response's finish reason tells the truth when the clamp is what ended it.

The KV budget of running requests is the exception: a request whose prompt + ``max_tokens``
could never fit it is refused by the engine before it queues (400, naming the numbers); one
that asked for no ``max_tokens`` has the entry's default lowered to what fits, as for the context.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import TypeVar

from ..config.schema import ModelConfig
from ..engine.types import SamplingParams
from ..errors import ContextLengthExceeded, InvalidRequest

FALLBACK_TEMPERATURE = 0.7
FALLBACK_TOP_P = 1.0
MAX_STOP_CHARS = 512  # a stop string is a few words; a megabyte one is an attack on the matcher
SEED_RANGE = (-(2**63), 2**64 - 1)  # what a 64-bit key can take; negative seeds wrap
TOKEN_ID = re.compile(r"-?[0-9]+", re.ASCII)  # str.isdigit() would take "²" and int() then fail

T = TypeVar("T")


@dataclass(frozen=True)
class SamplingRequest:
    """What a request asked for; None: not said (the model's default applies)."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logit_bias: dict[str, float] = field(default_factory=dict)
    ignore_eos: bool = False
    speculative: bool = True  # False: this request opts out of the entry's speculative decoding
    context_window: int | None = None  # the request's own context (Ollama's num_ctx), within the model's
    cache_salt: str | None = None  # the prefix cache shares this request's KV only with the same salt
    logprobs: int | None = None  # each written token's log-probability, with this many top candidates


@dataclass(frozen=True)
class Applied:
    """The sampling values a request runs with, as a response that echoes them says (Responses)."""

    temperature: float
    top_p: float
    presence_penalty: float
    frequency_penalty: float


def applied(req: SamplingRequest, cfg: ModelConfig | None) -> Applied:
    """What ``req`` runs with: its own values, else the entry's defaults (``cfg``), else the fallbacks."""
    return Applied(
        temperature=_first(req.temperature, cfg.default_temperature if cfg else None, FALLBACK_TEMPERATURE),
        top_p=_first(req.top_p, cfg.default_top_p if cfg else None, FALLBACK_TOP_P),
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
    )


def resolve_sampling(
    req: SamplingRequest,
    cfg: ModelConfig,
    *,
    prompt_len: int,
    context_length: int,
    vocab_size: int,
    kv_tokens: int | None = None,
) -> SamplingParams:
    """Merge ``req`` with the model's defaults; clamp max_tokens to the limits; check the prompt fits
    (the model's context, or the request's own window when it asks for a smaller one). ``kv_tokens``:
    the most tokens one request's KV may hold under the engine's budget, which a default max_tokens
    is lowered to (an asked one is the engine's to refuse)."""
    window = min(req.context_window, context_length) if req.context_window else context_length
    room = window - prompt_len
    if room <= 0 and window < context_length:
        raise ContextLengthExceeded(
            f"the prompt is {prompt_len} tokens; the request's context window is {window} tokens "
            f"(this model's is {context_length})"
        )
    if room <= 0:
        raise ContextLengthExceeded(
            f"the prompt is {prompt_len} tokens; this model's context is {context_length} tokens"
        )
    asked = req.max_tokens if req.max_tokens is not None else cfg.max_tokens
    max_tokens = max(1, min(asked, cfg.max_request_tokens, room))
    if kv_tokens is not None and req.max_tokens is None and prompt_len < kv_tokens:
        max_tokens = min(max_tokens, kv_tokens - prompt_len)  # the entry's default, lowered to what the budget holds
    bias = []
    for key, value in req.logit_bias.items():
        if not isinstance(key, str) or not TOKEN_ID.fullmatch(key):
            raise InvalidRequest(f"logit_bias keys must be token ids, got {str(key)[:20]!r}", param="logit_bias")
        token = int(key)
        if not 0 <= token < vocab_size:
            raise InvalidRequest(
                f"logit_bias token id {token} is outside the vocabulary (0..{vocab_size - 1})", param="logit_bias"
            )
        if not isinstance(value, (int, float)) or not math.isfinite(value) or not -100 <= value <= 100:
            raise InvalidRequest("logit_bias values must be numbers between -100 and 100", param="logit_bias")
        bias.append((token, float(value)))
    if req.seed is not None and not SEED_RANGE[0] <= req.seed <= SEED_RANGE[1]:
        raise InvalidRequest("seed must fit in 64 bits", param="seed")
    if any(len(s) > MAX_STOP_CHARS for s in req.stop):
        raise InvalidRequest(f"stop strings are at most {MAX_STOP_CHARS} characters", param="stop")
    values = applied(req, cfg)
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=values.temperature,
        top_p=values.top_p,
        top_k=max(req.top_k or 0, 0) if (req.top_k or 0) < vocab_size else 0,  # all of them: no filter
        min_p=req.min_p or 0.0,
        repetition_penalty=req.repetition_penalty or 1.0,
        presence_penalty=values.presence_penalty,
        frequency_penalty=values.frequency_penalty,
        seed=req.seed % 2**64 if req.seed is not None else None,
        stop=tuple(s for s in req.stop if s),
        logit_bias=tuple(bias),
        ignore_eos=req.ignore_eos,
        speculative=req.speculative,
        logprobs=req.logprobs,
    )


def _first(*values: T | None) -> T:
    return next(v for v in values if v is not None)
