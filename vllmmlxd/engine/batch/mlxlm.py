"""Every use of mlx-lm's private parts, in one place.

vllmmlxd builds on mlx-lm's ``BatchGenerator`` (per-row samplers, processors and stop
matchers; batched caches with padding; insert and remove at any step) and extends it: its
own generation batch (row groups, speculation) and prompt batch (chunks riding on the decode
pass) are installed in the generator, and they keep mlx-lm's per-row counters as mlx-lm does.
mlx-lm names those parts privately, so an upgrade may rename them: every read and write of
them is a function here, and ``PRIVATE`` lists them for ``tests/unit/engine/test_mlxlm_pins.py``,
which checks them against the installed mlx-lm so an upgrade fails there first, named.
"""

from __future__ import annotations

from typing import Any

from mlx_lm.generate import BatchGenerator

# The class, and the private attributes of its instances used here.
PRIVATE: dict[str, tuple[str, ...]] = {
    "mlx_lm.generate.BatchGenerator": ("_generation_batch", "_prompt_batch"),
    "mlx_lm.generate.GenerationBatch": ("_num_tokens", "_matchers", "_next_logprobs"),
    "mlx_lm.models.cache.BatchKVCache": ("_idx",),
    "mlx_lm.models.cache.RotatingKVCache": ("_idx",),
}


# -- the generator's two batches ------------------------------------------------------------


def generation_batch(gen: BatchGenerator) -> Any:
    """The rows being decoded (mlx-lm keeps one such batch for the generator's life)."""
    return gen._generation_batch


def prompt_batch(gen: BatchGenerator) -> Any:
    """The prompts being prefilled."""
    return gen._prompt_batch


def install(gen: BatchGenerator, *, generation: Any = None, prompts: Any = None) -> None:
    """Put vllmmlxd's own generation batch and/or prompt batch in a new generator."""
    if generation is not None:
        gen._generation_batch = generation
    if prompts is not None:
        gen._prompt_batch = prompts


# -- a generation batch's per-row counters --------------------------------------------------


def counted(batch: Any) -> list[int]:
    """Each row's tokens generated so far (the list itself: a change is the batch's)."""
    return batch._num_tokens


def matchers(batch: Any) -> list[Any]:
    """Each row's stop-sequence matcher (the list itself)."""
    return batch._matchers


def start_counters(batch: Any, rows: int, empty_logprobs: Any) -> None:
    """A batch built by hand: no token counted yet, and what comes back with a row's first pass."""
    batch._num_tokens = [0] * rows
    batch._next_logprobs = [empty_logprobs for _ in range(rows)]


def set_next_logprobs(batch: Any, logprobs: list[Any]) -> None:
    """The log-probabilities that come back with each row's next token."""
    batch._next_logprobs = logprobs


# -- caches -----------------------------------------------------------------------------------


def written(cache: Any) -> int:
    """How far a (batched or rotating) cache's buffer is written; the rest is spare."""
    return int(cache._idx)


def set_written(cache: Any, n: int) -> None:
    cache._idx = n
