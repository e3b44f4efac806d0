"""Written tokens' log-probabilities (``engine.step.logprobs.TokenLogprob``) in each API's words.
Pure.

A token's text is the tokenizer's decoding of it alone (a token that holds part of a character
decodes to U+FFFD, and its ``bytes`` are those of that text); values are the model's raw
distribution (see the engine module), a -inf written as -9999.0, as JSON has no infinity.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

FLOOR = -9999.0


def _value(logprob: float | None) -> float | None:
    return logprob if logprob is None or math.isfinite(logprob) else FLOOR


def named(entry: Any, as_ids: bool) -> str:
    """A token's name in the answer: its text, or (vLLM's ``return_tokens_as_token_ids``) ``token_id:N``."""
    return f"token_id:{entry.token}" if as_ids else entry.text


def _token(entry: Any, as_ids: bool) -> dict[str, Any]:
    return {"token": named(entry, as_ids), "logprob": _value(entry.logprob), "bytes": list(entry.text.encode())}


def token_entries(entries: Iterable[Any], as_ids: bool = False) -> list[dict[str, Any]]:
    """Chat completions' ``logprobs.content``, the Responses API's ``logprobs`` and Ollama's:
    each token with its ``top_logprobs``."""
    return [{**_token(e, as_ids), "top_logprobs": [_token(c, as_ids) for c in e.top or ()]} for e in entries]


def completion_logprobs(entries: Iterable[Any], offset: int, as_ids: bool = False) -> dict[str, Any]:
    """Text completions' (legacy) ``logprobs``: parallel lists, each token's ``text_offset`` in the
    choice's text counted from ``offset``."""
    tokens, values, tops, offsets = [], [], [], []
    for e in entries:
        tokens.append(named(e, as_ids))
        values.append(_value(e.logprob))
        # A prompt's first token (echo) has no log-probability: None in both lists, as OpenAI writes it.
        tops.append(None if e.top is None else {named(c, as_ids): _value(c.logprob) for c in e.top})
        offsets.append(offset)
        offset += len(e.text)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}
