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


def test_whether_a_model_speculates_is_measured_at_load_not_named_by_family():
    from tests.support.families import build
    from vllmmlxd.engine.batch.layout import DRIFT_LIMIT, read_layout

    # Latent attention's multi-token pass departs from its one-token steps in bfloat16 only.
    latent = read_layout(build("deepseek_v3", "float32"))
    assert latent.speculation() is None and latent.drift is not None and latent.drift < 1e-3
    half = read_layout(build("deepseek_v3", "q4"))
    why = half.speculation()
    assert half.drift is not None and half.drift > DRIFT_LIMIT
    assert why is not None and "verify pass departs" in why and "bfloat16" in why
    for family in ("llama", "qwen3_moe", "glm4_moe"):  # the plain families agree in both precisions
        assert read_layout(build(family, "q4")).speculation() is None
    assert read_layout(build("deepseek_v3", "q4"), probe=False).speculation() is None  # a sharded rank: not measured
