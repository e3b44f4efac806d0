"""A model's layout, read from its own cache objects (engine/batch/layout.py): what each family's layers
keep, how its prefix cache holds them, and whether it may speculate."""

from __future__ import annotations

import pytest

from tests.support.families import build
from vllmmlxd.engine.batch.layout import CacheLayout, LayerCache, read_layout

KINDS = {
    "llama": ("blocks", "trim"),
    "qwen3_moe": ("blocks", "trim"),
    "deepseek_v3": ("blocks", "trim"),
    "gemma3_text": ("blocks+windows", "replay"),
    "gpt_oss": ("blocks+windows", "replay"),
    "qwen3_5": ("blocks+checkpoints", "replay"),
    "nemotron_h": ("blocks+checkpoints", "replay"),
    "lfm2": ("blocks+checkpoints", "replay"),
}


@pytest.mark.parametrize("family", sorted(KINDS))
def test_each_family_is_held_and_undoes_a_draft_by_what_its_layers_keep(family):
    layout = read_layout(build(family, "float32"))
    held, rollback = KINDS[family]
    assert layout.family == family and layout.prefix_cache(32) == held
    assert layout.rollback == rollback and layout.speculation() is None
    assert layout.describe()["rollback"] == rollback


def test_windows_and_states_are_read_with_their_sizes():
    gemma = read_layout(build("gemma3_text", "float32"))
    assert [layer.kind for layer in gemma.layers] == ["window", "window", "attention"]
    assert gemma.widest_window == 64 and gemma.describe()["windows"] == [64]
    qwen = read_layout(build("qwen3_5", "q4"))
    assert [layer.arrays for layer in qwen.layers if layer.kind == "state"] == [2, 2]
    assert qwen.dtype == "bfloat16" and qwen.describe()["layers"] == {"state": 2, "attention": 2}


def test_what_blocks_cannot_hold_is_kept_whole():
    opaque = CacheLayout("x", (LayerCache("attention"), LayerCache("other", name="ChunkedKVCache")))
    assert opaque.prefix_cache(32) == "sequences" and "opaque" in (opaque.speculation() or "")
    assert opaque.rollback is None and "ChunkedKVCache" in (opaque.speculation() or "")
    narrow = CacheLayout("x", (LayerCache("attention"), LayerCache("window", window=16)))
    assert narrow.prefix_cache(32) == "sequences"  # a block would leave the window before it is whole


@pytest.mark.parametrize(
    "family,batching",
    [
        ("llama", "row groups, prompt chunks riding on the decode pass"),
        ("qwen3_moe", "row groups"),
        ("deepseek_v3", "row groups"),
        ("gemma3_text", "row groups"),
        ("gpt_oss", "row groups"),
        ("qwen3_5", "row groups"),
        ("nemotron_h", "row groups"),
        ("gemma4_text", "one padded batch"),  # layers that share an earlier layer's KV
    ],
)
def test_rows_join_in_groups_wherever_the_layers_allow(family, batching):
    from vllmmlxd.engine.options import EngineOptions
    from vllmmlxd.engine.step.scheduler import Scheduler
    from vllmmlxd.engine.types import EngineStats

    scheduler = Scheduler(build(family, "float32"), set(), EngineOptions(), EngineStats())
    assert scheduler.features()["batching"] == batching
