"""The mlx-lm bugs the engine carries fixes for (engine/batch/upstream_fixes.py): each test shows the bug
in the installed mlx-lm with the fix taken off, and gone with it on. When a test's first half
fails, mlx-lm fixed the bug itself: drop the fix and this test."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import BatchRotatingKVCache, RotatingKVCache, make_prompt_cache

from tests.support.families import build
from vllmmlxd.engine.batch import upstream_fixes


def _nemotron_state_gap() -> float:
    """How far a right-padded row's Mamba-2 state is from the same prompt's state alone."""
    model = build("nemotron_h", "float32")
    rng = np.random.default_rng(3)
    short, long = rng.integers(1, 500, size=40).tolist(), rng.integers(1, 500, size=48).tolist()
    alone = make_prompt_cache(model)
    model(mx.array([short]), cache=alone)
    batch = [
        c.merge([a, b]) for c, a, b in zip(make_prompt_cache(model), make_prompt_cache(model), make_prompt_cache(model))
    ]
    for c in batch:
        c.prepare(lengths=[40, 48], right_padding=[8, 0])
    model(mx.array([short + [0] * 8, long]), cache=batch)
    for c in batch:
        c.finalize()
    return max(float(mx.abs(x[0:1] - y).max()) for x, y in zip(batch[0].cache, alone[0].cache))


def test_nemotron_h_reads_a_padded_row_s_state_after_its_padding_without_the_fix():
    upstream_fixes.apply_all()
    with upstream_fixes.unapplied("nemotron_h_ssm_lengths"):
        assert _nemotron_state_gap() > 1e-2, "mlx-lm passes lengths itself now: drop nemotron_h_ssm_lengths"
    assert _nemotron_state_gap() < 1e-5


def _window_seen() -> list[float]:
    """What the first new token of a short row sees after a one-token step and a four-token one,
    in a batch with a row longer than the window (keys are their positions' labels)."""
    window = 8
    long, short = RotatingKVCache(window), RotatingKVCache(window)
    labels = mx.arange(12, dtype=mx.float32).reshape(1, 1, 12, 1)
    long.update_and_fetch(labels + 100, labels + 100)
    short.update_and_fetch(labels[..., :5, :] + 200, labels[..., :5, :] + 200)
    batch = BatchRotatingKVCache.merge([long, short])
    one = mx.array([300.0, 400.0]).reshape(2, 1, 1, 1)
    batch.update_and_fetch(one, one)
    mask = batch.make_mask(4, window_size=window)  # a model takes the mask before the layers write
    four = mx.concatenate([mx.arange(4.0).reshape(1, 1, 4, 1) + 310, mx.arange(4.0).reshape(1, 1, 4, 1) + 410])
    keys, _ = batch.update_and_fetch(four, four)
    return [keys[1, 0, j, 0].item() for j in range(keys.shape[2]) if mask[1, 0, 0, j].item()]


def test_a_batched_window_hides_a_short_row_s_oldest_token_after_a_one_token_step_without_the_fix():
    upstream_fixes.apply_all()
    every = [200.0, 201.0, 202.0, 203.0, 204.0, 400.0, 410.0]  # the short row's tokens, and the new one
    with upstream_fixes.unapplied("batch_rotating_mask_after_rotation"):
        assert _window_seen() != every, "mlx-lm masks this right now: drop batch_rotating_mask_after_rotation"
    assert _window_seen() == every
