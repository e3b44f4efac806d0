"""Fidelity harness (tests/support/fidelity.py), families whose layers are all attention: dense,
experts, latent attention. Their prefix cache holds blocks; they speculate (latent attention at
float32 only)."""

from __future__ import annotations

import pytest

from tests.support.families import PRECISIONS
from tests.support.fidelity import check
from tests.support.fidelity_checks import assert_faithful
from vllmmlxd.engine.cache import kv

FAMILIES = ("llama", "qwen3", "phi3", "qwen3_moe", "glm4_moe", "deepseek_v3")


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("family", FAMILIES)
def test_every_engine_path_answers_as_mlx_lm_does(family, precision, tmp_path):
    assert_faithful(check(family, precision, tmp_path))


def test_the_harness_fails_an_engine_whose_prefix_cache_joins_a_wrong_block(tmp_path, monkeypatch):
    join = kv.BlockKV.join_arrays

    def doubled(self, blocks, n):  # the second block's KV stands in for the first's
        return join(self, [blocks[1], *blocks[1:]] if len(blocks) > 2 else blocks, n)

    monkeypatch.setattr(kv.BlockKV, "join_arrays", doubled)
    report = check("llama", "float32", tmp_path, paths=("again", "extended", "disk"))
    assert {d.path for d in report.failures} >= {"again", "extended", "disk"}, report.departures


def test_latent_attention_speculates_at_float32_and_not_in_bfloat16():
    from tests.support.families import build
    from vllmmlxd.engine.batch.layout import read_layout

    assert read_layout(build("deepseek_v3", "float32")).speculation() is None
    why = read_layout(build("deepseek_v3", "q4")).speculation()
    assert why is not None and "latent attention" in why and "bfloat16" in why
