"""The oracle: mlx-lm's own greedy generation of a prompt alone, and the rounding its own
computations show, which a path of the engine may show too (agreement.near_tie)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache

PREFILL_STEP = 48  # noise(): the prompt's chunks when computed the second way


@dataclass(frozen=True)
class Reference:
    """mlx-lm's greedy answer to one prompt, and at each position the margin of its choice (its
    logit less the runner-up's), its logit and its log-probability."""

    tokens: tuple[int, ...]
    margins: tuple[float, ...]
    tops: tuple[float, ...]
    logprobs: tuple[float, ...] = ()


def reference(model: Any, prompt: list[int], n: int) -> Reference:
    """mlx-lm's ``generate_step`` on ``prompt`` alone: ``n`` greedy tokens and their margins."""
    seen: list[mx.array] = []

    def record(tokens: mx.array, logits: mx.array) -> mx.array:
        seen.append(logits)
        return logits

    steps = generate_step(
        mx.array(prompt), model, max_tokens=n, prompt_cache=make_prompt_cache(model), logits_processors=[record]
    )
    tokens = [int(token) for (token, _), _ in zip(steps, range(n))]
    margins, tops, logprobs = [], [], []
    for logits, token in zip(seen[:n], tokens):
        row = logits.astype(mx.float32).reshape(-1)
        top = np.sort(np.array(row))[-2:]
        margins.append(float(top[1] - top[0]))
        tops.append(float(top[1]))
        logprobs.append(float(row[token] - mx.logsumexp(row)))
    return Reference(tuple(tokens), tuple(margins), tuple(tops), tuple(logprobs))


def noise(model: Any, prompt: list[int], answer: tuple[int, ...]) -> float:
    """How far two ways mlx-lm itself computes one sequence's logits differ (the prompt and its
    answer in one pass; the prompt in chunks, then the answer a token at a time): the rounding
    of this family at this precision, which a path of the engine may show too."""
    tokens = prompt + list(answer)
    start = len(prompt) - 1
    whole = model(mx.array([tokens]), cache=make_prompt_cache(model))[0, start:].astype(mx.float32)
    cache, parts, at = make_prompt_cache(model), [], 0
    while at < start:
        stop = min(at + PREFILL_STEP, start)
        model(mx.array([tokens[at:stop]]), cache=cache)
        at = stop
    for token in tokens[start:]:
        parts.append(model(mx.array([[token]]), cache=cache)[0])
    return float(mx.abs(whole - mx.concatenate(parts).astype(mx.float32)).max())


def kv_noise(model: Any, prompt: list[int], answer: tuple[int, ...], bits: int, group_size: int) -> float | None:
    """How far mlx-lm's logits move when its own cache holds the KV quantized to ``bits``
    (``QuantizedKVCache``) rather than whole: the rounding a quantized KV cache brings, which the
    engine's (quantized in its own groups) may show too. None where mlx-lm cannot quantize this
    model's KV: layers other than plain attention, or heads narrower than every group size."""
    tokens = prompt + list(answer)
    start = len(prompt) - 1
    if not all(hasattr(layer, "to_quantized") for layer in make_prompt_cache(model)):
        return None
    whole = model(mx.array([tokens]), cache=make_prompt_cache(model))[0, start:].astype(mx.float32)
    for group in dict.fromkeys((group_size, 32)):  # mlx-lm groups along a head: a narrow head needs a smaller group
        cache = [layer.to_quantized(group_size=group, bits=bits) for layer in make_prompt_cache(model)]
        try:
            model(mx.array([tokens[:start]]), cache=cache)
        except ValueError:  # the head is not a multiple of the group
            continue
        parts = [model(mx.array([[token]]), cache=cache)[0] for token in tokens[start:]]
        return float(mx.abs(whole - mx.concatenate(parts).astype(mx.float32)).max())
    return None


def precision_of(model: nn.Module) -> str:
    """``float32`` when every weight is, else ``q4`` (the lower precisions' near-tie: bfloat16,
    float16 or quantized weights, whose activations are half precision)."""
    # Without a destination, tree_flatten returns (name, array) pairs; it is typed as that or a dict.
    params = [p for _, p in cast(list[tuple[str, mx.array]], tree_flatten(model.parameters()))]
    floats = [p.dtype for p in params if mx.issubdtype(p.dtype, mx.floating)]
    quantized = any(p.dtype == mx.uint32 for p in params)
    return "float32" if floats and not quantized and all(d == mx.float32 for d in floats) else "q4"
