"""kv_budget.py: what a request's KV costs and the admission verdicts (fit, wait, never), pure."""

from __future__ import annotations

import pytest

from vllmmlxd.engine.options import explicit_limit
from vllmmlxd.engine.step.kv_budget import (
    FLOOR,
    GROWTH_STEP,
    MARGIN_MIN,
    MIB,
    PEAK_COPIES,
    WORKER_OVERHEAD,
    KvBudget,
    KvLayout,
    LayerKv,
    default_limit,
)

PLAIN = KvLayout((LayerKv(256), LayerKv(256)))  # two attention layers, 256 bytes a token each


def test_a_plain_layout_costs_bytes_a_token_in_every_layer():
    assert PLAIN.per_token == 512
    assert PLAIN.bytes_for(1000) == 512_000
    assert PLAIN.longest_within(512_000) == 1000 and PLAIN.longest_within(511_999) == 999


def test_a_sliding_window_and_a_recurrent_state_stop_growing():
    layout = KvLayout((LayerKv(100), LayerKv(100, cap=64), LayerKv(0, fixed=5000)))
    assert layout.bytes_for(10) == 1000 + 1000 + 5000
    assert layout.bytes_for(1000) == 100_000 + 6400 + 5000  # the window keeps 64 tokens
    assert KvLayout((LayerKv(100, cap=64), LayerKv(0, fixed=10))).longest_within(10_000) is None  # any length fits


def test_a_batch_pads_every_row_to_the_longest():
    # mlx-lm's BatchKVCache aligns its rows: a short row beside a long one costs the long one's width.
    assert PLAIN.batch_bytes([1000, 10]) == 2 * 512_000
    assert PLAIN.batch_bytes([]) == 0


def budget(tokens_for_one: int, rows: int = 2) -> KvBudget:
    """A budget that holds ``rows`` rows of ``tokens_for_one`` (growth step included)."""
    return KvBudget(PLAIN, limit=rows * PLAIN.bytes_for(tokens_for_one), source="max_kv_memory_mb")


def test_fit_wait_and_never():
    b = budget(100 + 400 + GROWTH_STEP)  # two requests of a 100-token prompt and max_tokens 400
    width = b.width(100, 400)
    assert width == 756
    assert b.verdict([], width) == "fits"
    assert b.verdict([width], width) == "fits"
    assert b.verdict([width, width], width) == "waits"  # a third waits for one to finish
    assert b.verdict([], b.width(100, 2000)) == "never"  # alone it would not fit either
    # A short request waits beside two long ones: the batch would pad it to their width.
    assert b.verdict([width, width], b.width(5, 5)) == "waits"


def test_the_largest_request_is_what_fits_alone_less_the_growth_step():
    b = budget(1000, rows=1)
    assert b.largest_request() == 1000 - GROWTH_STEP
    assert b.verdict([], b.width(500, 1000 - GROWTH_STEP - 500)) == "fits"
    assert b.verdict([], b.width(500, 1000 - GROWTH_STEP - 499)) == "never"


def test_the_refusal_names_the_numbers():
    b = budget(1000, rows=1)
    text = b.refusal(300, 2000)
    assert "300 prompt + 2,000 max_tokens tokens" in text
    assert "512 bytes a token" in text and "max_kv_memory_mb" in text
    assert f"room for {1000 - GROWTH_STEP:,} tokens" in text and "lower max_tokens" in text
    assert "1.2 MB of KV cache" in text  # (300 + 2000 + 256) x 512 bytes


def test_no_budget_admits_everything():
    for b in (KvBudget(PLAIN), KvBudget(None, limit=1 << 20)):
        assert not b.active and b.verdict([10**6] * 50, 10**6) == "fits" and b.largest_request() is None


def test_reserved_and_describe():
    b = budget(756)
    assert b.reserved([756, 300]) == 2 * 756 * 512
    block = b.describe(reserved=b.reserved([756]), held=4096, peak=8192)
    assert block["budget_mb"] == round(2 * 756 * 512 / MIB, 3) and block["bytes_per_token"] == 512
    assert block["largest_request_tokens"] == 2 * 756 - GROWTH_STEP and block["source"] == "max_kv_memory_mb"
    assert block["held_mb"] == round(4096 / MIB, 3) and block["peak_held_mb"] == round(8192 / MIB, 3)


def test_the_default_is_what_is_left_after_weights_cache_worker_and_margin():
    limit, note = default_limit(16 * 1024 * MIB, "MemTotal", held=2048 * MIB, cache_budget=3276 * MIB)
    margin = int(16 * 1024 * MIB * 0.10)
    # Halved: a row joining or leaving the batch makes mlx-lm copy the batch's KV for a moment.
    assert limit == (16 * 1024 * MIB - 2048 * MIB - 3276 * MIB - WORKER_OVERHEAD - margin) // PEAK_COPIES
    assert note.startswith("default: (16,384.0 MB usable (MemTotal) - 2,048.0 MB held at start")
    assert note.endswith(f"/ {PEAK_COPIES} for the copies a batch makes")
    # A small machine keeps at least MARGIN_MIN free, and a budget never below FLOOR.
    limit, note = default_limit(2048 * MIB, "cgroup memory.max", held=1800 * MIB, cache_budget=0)
    assert limit == FLOOR and "is below" in note
    assert default_limit(4096 * MIB, "x", 0, 0)[0] == (4096 * MIB - WORKER_OVERHEAD - MARGIN_MIN) // PEAK_COPIES
    assert default_limit(None, "unknown", 0, 0)[0] is None


@pytest.mark.parametrize("value", [1, 0.5, 2048])
def test_an_explicit_budget_in_mb(value):
    limit, source = explicit_limit(value)
    assert limit == int(value * MIB) and source == f"max_kv_memory_mb {value:g}"


def test_a_layered_model_reserves_its_prompt_s_windowed_kv_and_checkpoints_too():
    from tests.support.families import build
    from vllmmlxd.engine.cache.checkpoints import checkpoint_count
    from vllmmlxd.engine.options import EngineOptions
    from vllmmlxd.engine.step.kv_probe import probe_layout
    from vllmmlxd.engine.step.scheduler import Scheduler
    from vllmmlxd.engine.types import EngineStats

    for family in ("qwen3_5", "gemma3_text"):
        model = build(family, "float32")
        plain = KvLayout(probe_layout(model).layers)
        cached = Scheduler(model, set(), EngineOptions(cache_budget_bytes=1 << 20), EngineStats()).kv.layout
        uncached = Scheduler(model, set(), EngineOptions(cache_budget_bytes=0), EngineStats()).kv.layout
        assert uncached == plain and cached is not None
        state = sum(layer.fixed for layer in plain.layers)
        windowed = (
            plain.bytes_for(2000)
            - plain.bytes_for(0)
            - sum(layer.per_token * 2000 for layer in plain.layers if layer.cap is None)
        )
        extra = cached.bytes_for(2000) - plain.bytes_for(2000)
        if family == "qwen3_5":
            assert state > 0 and extra == state * checkpoint_count(2000, 32)
        else:
            assert state == 0 and extra == sum(layer.per_token for layer in plain.layers if layer.cap) * 2000 > windowed
