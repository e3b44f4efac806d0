"""Where a prompt of a model with recurrent layers stops to checkpoint its state, and what a
sequence captured on its way. Pure; no mlx.

A recurrent layer's state (Mamba, gated delta, a short convolution) is one fixed-size value
that holds the whole prefix: it cannot be cut back to an earlier position as attention KV can,
so the prefix cache can only continue a prompt from a position where the state was saved.
The prefill is split there (mlx-lm's prompt segments: a chunk never crosses a segment's end)
and the row's state is copied after the chunk. The positions, block ends all:

- every ``spacing(p)`` tokens, the spacing growing with the position (an eighth of it, at
  least ``MIN_SPACING``), so a conversation that leaves a stored one anywhere reuses at least
  7/8 of what they share (a new chat on the same system prompt, an edited earlier turn), and
  a long prompt costs a few checkpoints per doubling of its length, not one per block;
- the last block end of the prompt (an exact resend, and the next turn of an agent, which
  starts with the whole of this prompt);
- a ``hint``: where this prompt left the longest stored sequence it shares a start with, so
  the next prompt that leaves it there too reuses all of it.

Windowed layers (a sliding window) need no split: while a block's positions are in the window
they are cut into it (``Captures.windows``), after every prefill chunk and at the end.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MIN_SPACING = 128  # tokens between checkpoints at least: shorter prefill chunks waste the hardware
RATIO = 8  # the spacing is at most this fraction of the position: at least 7/8 of a shared start is reused


def spacing(position: int, block: int) -> int:
    """Tokens between checkpoints around ``position``: the largest power-of-two multiple of the
    block at most ``position / RATIO``, and at least ``MIN_SPACING`` (rounded to blocks)."""
    floor = max(block, -(-MIN_SPACING // block) * block)
    step = floor
    while step * 2 * RATIO <= position:
        step *= 2
    return step


def checkpoint_positions(start: int, prompt: int, block: int, hint: int | None = None) -> list[int]:
    """The positions in ``(start, prompt - 1]`` after which a prompt of ``prompt`` tokens, its
    first ``start`` from the cache, checkpoints its state: block ends, in order."""
    last = (prompt - 1) // block * block  # the last token is fed with the generation's first step
    out: set[int] = set()
    position = (start // block + 1) * block
    while position <= last:
        if position % spacing(position, block) == 0:
            out.add(position)
        position += block
    if last > start:
        out.add(last)
    if hint is not None:
        at = hint // block * block
        if start < at <= last:
            out.add(at)
    return sorted(out)


def checkpoint_count(prompt: int, block: int) -> int:
    """How many checkpoints a prompt of ``prompt`` tokens makes from scratch, at most (the last
    block end may be one of the others), in closed form: below ``2 x RATIO`` times the first
    spacing every multiple of it, then each doubling of the position at twice the spacing."""
    last = (prompt - 1) // block * block
    if last <= 0:
        return 0
    first = spacing(0, block)
    count = min(last, 2 * RATIO * first - 1) // first
    step, low = 2 * first, 2 * RATIO * first
    while low <= last:
        high = min(last, 2 * low - 1)
        count += high // step - (low - 1) // step
        step, low = step * 2, low * 2
    return count + 1


def segments(tokens: list[int], start: int, positions: list[int]) -> list[list[int]]:
    """``tokens[start:]`` cut at ``positions`` (absolute): mlx-lm's prompt segments."""
    out, at = [], start
    for position in positions:
        if position > at:
            out.append(tokens[at:position])
            at = position
    if at < len(tokens):
        out.append(tokens[at:])
    return out


@dataclass
class Captures:
    """What a sequence's layers held on its way that its final cache no longer does: each
    block's windowed KV (by the block's first position), and its recurrent state at some
    positions. Handed to the prefix cache with the sequence's KV when it is stored."""

    checkpoints: frozenset[int] = frozenset()  # where the state is to be copied (positions)
    windows: dict[int, Any] = field(default_factory=dict)
    states: dict[int, Any] = field(default_factory=dict)
    window_until: int = 0  # windowed KV cut up to here (a block end)
    windows_at: int = 0  # the sequence's generated tokens when its windows were last read

    @property
    def nbytes(self) -> int:
        return sum(_nbytes(x) for x in (*self.windows.values(), *self.states.values()))


def _nbytes(value: Any) -> int:
    size = getattr(value, "nbytes", None)
    if isinstance(size, int):
        return size
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return 0
