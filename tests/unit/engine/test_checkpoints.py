"""Where a recurrent model's prompt checkpoints its state (engine/cache/checkpoints.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from vllmmlxd.engine.cache.checkpoints import MIN_SPACING, checkpoint_positions, segments, spacing

BLOCK = 32


def test_checkpoints_grow_apart_with_the_position_and_end_at_the_prompt_s_last_block():
    assert checkpoint_positions(0, 50, BLOCK) == [32]
    assert checkpoint_positions(0, 600, BLOCK) == [128, 256, 384, 512, 576]
    long = checkpoint_positions(0, 5000, BLOCK)
    assert long[-1] == 4992 and 3840 in long and 3968 not in long  # past 4,096: every 512
    assert spacing(100, BLOCK) == MIN_SPACING and spacing(4096, BLOCK) == 512


def test_a_hint_adds_the_block_where_the_prompt_left_a_stored_one():
    assert 1504 in checkpoint_positions(0, 2000, BLOCK, hint=1510)
    assert checkpoint_positions(1024, 1200, BLOCK) == [1152, 1184]  # the start is cached: none at or before it


@given(st.integers(0, 20_000), st.integers(2, 20_000), st.integers(0, 20_000))
def test_whatever_a_prompt_shares_past_a_thousand_tokens_at_least_seven_eighths_is_before_a_checkpoint(
    start, prompt, shared
):
    start, shared = min(start, prompt - 1), max(min(shared, prompt - 1), min(start, prompt - 1))
    positions = checkpoint_positions(start, prompt, BLOCK)
    assert positions == sorted(set(positions)) and all(p % BLOCK == 0 and start < p < prompt for p in positions)
    best = max(p for p in [start, *positions] if p <= shared)
    assert shared - best <= max(MIN_SPACING, shared / 8)  # 7/8 past 1,024 tokens; 128 tokens at most before


def test_segments_cut_the_uncached_tokens_at_the_positions():
    tokens = list(range(10))
    assert segments(tokens, 2, [4, 8]) == [[2, 3], [4, 5, 6, 7], [8, 9]]
    assert segments(tokens, 0, []) == [tokens]
