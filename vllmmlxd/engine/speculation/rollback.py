"""Undoing a verify pass where the KV cannot be trimmed: sliding windows and recurrent states.

A verify pass writes every draft position of every row. Attention KV is trimmed back to what
each row kept (``speculative._trim_rows``). A sliding window has already dropped the oldest
positions to make room for the drafts, and a recurrent state (Mamba, gated delta, short
convolutions) has folded them in: neither can give back a rejected position. So for such a
model the batch keeps what each layer held before the pass (``snapshot``: references, since
mlx-lm replaces a window's arrays in a multi-token pass and a recurrent layer's arrays in any
pass, and copies of the few small position vectors it changes in place), puts it back when a
row kept fewer positions than the pass wrote (``restore``), and feeds each row the tokens it
kept (``replay``): one more pass, right-padded as mlx-lm pads a batch of unequal prompts, whose
caches end exactly as if those tokens had come one step at a time. A step whose every row kept
every position needs neither.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from ..batch.row_groups import GroupedKV


@dataclass(frozen=True)
class Saved:
    """One cache's state before a pass (a grouped layer's: each group's)."""

    cache: Any
    state: Any


def snapshot(caches: list[Any]) -> list[Saved]:
    """What every cache of the batch holds now, cheaply: big arrays by reference, small ones copied."""
    out = []
    for layer in caches:
        for cache in layer.groups if isinstance(layer, GroupedKV) else (layer,):
            out.append(Saved(cache, _held(cache.state)))
    return out


def restore(saved: list[Saved]) -> None:
    """Every cache back to its snapshot (the pass's writes past it are spare or dropped)."""
    for s in saved:
        s.cache.state = s.state


def replay(model: Any, caches: list[Any], emitted: list[list[int]]) -> None:
    """Feed each row its ``emitted`` tokens in one pass, right-padded to the longest (mlx-lm's
    ``prepare``/``finalize`` keep the padding out of windows and states and move it to the left
    of attention KV); the logits are not read."""
    lengths = [len(e) for e in emitted]
    longest = max(lengths)
    padding = [longest - n for n in lengths]
    tokens = mx.array([[*e, *([0] * p)] for e, p in zip(emitted, padding)], dtype=mx.uint32)
    padded = any(padding)
    if padded:
        for c in caches:
            c.prepare(lengths=lengths, right_padding=padding)
    model(tokens, cache=caches)
    if padded:
        for c in caches:
            c.finalize()
    mx.eval([c.state for c in caches])


def _held(state: Any) -> Any:
    """A cache's state, safe to put back after a pass: mlx-lm updates a cache's position vectors
    (offset, padding) in place (``+=`` on an mx.array changes that array), so those are copied;
    a list of a recurrent layer's arrays is copied as a list (its items are replaced, not changed)."""
    if isinstance(state, list):
        return list(state)
    if isinstance(state, tuple):
        return tuple(_held(x) for x in state)
    if isinstance(state, mx.array) and state.ndim <= 1:
        return mx.array(state)
    return state
