"""What can be split over ranks: the tables against the installed mlx-lm, and the pure rules."""

from __future__ import annotations

import re
from pathlib import Path

import mlx_lm
import mlx_lm.utils
import pytest

from tests.support.groups import StandInGroup
from vllmmlxd.runtime import shard_families as sf

MODELS = Path(mlx_lm.__file__).parent / "models"


def _files(pattern: str) -> set[str]:
    return {f.stem for f in MODELS.glob("*.py") if re.search(pattern, f.read_text())}


def test_the_tables_are_what_the_installed_mlx_lm_can_do():
    # Fails when the mlx-lm pin moves and its families change: update the tables with it.
    assert _files(r"class \w+\([^)]*PipelineMixin") == sf.MLX_LM_PIPELINE
    assert _files(r"\n    def shard\(") == sf.MLX_LM_TENSOR
    assert sf.MLX_LM_REMAPPING == mlx_lm.utils.MODEL_REMAPPING


def test_vllmmlxd_adds_llama_by_pipeline_which_mlx_lm_lacks():
    assert "llama" not in sf.MLX_LM_PIPELINE and "llama" in sf.PIPELINE
    # mistral is a llama to mlx-lm, so it pipelines too.
    assert sf.split_problem(sf.ModelShape("mistral", 32, 32, 8), "pipeline", 2) is None


SMOLLM2 = sf.ModelShape("llama", layers=30, heads=9, kv_heads=3, intermediate=1536)


@pytest.mark.parametrize(
    "shape, parallel, world, problem",
    [
        (SMOLLM2, "pipeline", 2, None),
        (SMOLLM2, "tensor", 2, None),  # 9 heads over 2: split per key/value group (6 + 3)
        (SMOLLM2, "tensor", 3, None),
        (SMOLLM2, "tensor", 4, "at least one key/value head per rank \\(3 key/value heads\\)"),
        (sf.ModelShape("llama", 2, 4, 2, 128), "pipeline", 3, "at least as many layers \\(2\\) as ranks"),
        (sf.ModelShape("qwen3", 28, 16, 8, 3072), "pipeline", 2, "cannot split a qwen3 model by pipeline.*tensor"),
        (sf.ModelShape("qwen3", 28, 16, 8, 3072), "tensor", 2, None),
        (sf.ModelShape("qwen3", 28, 14, 2, 3072), "tensor", 4, "heads \\(14\\) and key/value heads \\(2\\)"),
        (sf.ModelShape("gemma3", 26, 8, 4), "tensor", 2, "cannot split a gemma3 model by tensor; tensor splits: "),
        (sf.ModelShape("llama", 16, 8, 8, 1001), "tensor", 2, "MLP width \\(1001\\)"),
    ],
)
def test_split_problems_say_what_fails_and_what_would_work(shape, parallel, world, problem):
    found = sf.split_problem(shape, parallel, world)
    if problem is None:
        assert found is None
    else:
        assert found is not None and re.search(problem, found), found


@pytest.mark.parametrize("layers, world", [(30, 2), (30, 4), (7, 3), (2, 2)])
def test_layer_shares_are_mlx_lms_pipeline_split(layers, world):
    from mlx_lm.models.pipeline import PipelineMixin

    covered = []
    for rank in range(world):
        stage = PipelineMixin()
        stage.layers = list(range(layers))
        stage.pipeline(StandInGroup(rank, world))
        assert sf.layer_share(layers, world, rank) == (stage.start_idx, stage.end_idx)
        covered += range(*sf.layer_share(layers, world, rank))
    assert sorted(covered) == list(range(layers))
    assert sf.layer_share(layers, world, 0)[1] == layers  # rank 0 runs the last layers


@pytest.mark.parametrize("kv, world", [(3, 2), (8, 3), (8, 8), (2, 2)])
def test_kv_group_shares_cover_every_group_once_as_evenly_as_whole_groups_allow(kv, world):
    shares = [sf.kv_group_share(kv, world, r) for r in range(world)]
    assert [h for lo, hi in shares for h in range(lo, hi)] == list(range(kv))
    sizes = [hi - lo for lo, hi in shares]
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1


def test_the_shape_comes_from_config_json_or_its_text_part(tmp_path):
    assert sf.read_shape(
        {"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
    ) == sf.ModelShape("llama", 2, 4, 2)
    vlm = {"model_type": "qwen2_5_vl", "text_config": {"num_hidden_layers": 3, "num_attention_heads": 8}}
    assert sf.read_shape(vlm) == sf.ModelShape("qwen2_5_vl", 3, 8, 8)
    assert sf.folder_shape(tmp_path) is None
    (tmp_path / "config.json").write_text("{not json")
    assert sf.folder_shape(tmp_path) is None
