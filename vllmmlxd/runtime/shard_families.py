"""Which model families can be split over several ranks, and how (pure: no mlx import).

The config checks a distributed entry before any rank starts, so these tables restate what the
pinned mlx-lm can do (``tests/unit/runtime/test_shard_families.py`` re-derives them from its
sources and fails when the pin moves), plus what vllmmlxd adds itself: llama by pipeline
(``engine/distributed/pipeline_llama.py``), and llama by tensor with its heads split per key/value group, which
also splits a model whose head count the rank count does not divide (``engine/distributed/shard_llama.py``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# mlx-lm 0.32: model files whose model class mixes in PipelineMixin, and those with ``def shard``.
MLX_LM_PIPELINE = frozenset(
    {
        "bailing_hybrid",
        "deepseek_v2",
        "deepseek_v3",
        "deepseek_v32",
        "deepseek_v41",
        "glm4_moe",
        "glm4_moe_lite",
        "minimax_m3_vl",
        "ministral3",
        "mistral4",
        "muse_spark",
        "qwen2",
        "qwen3_5",
        "qwen3_moe",
        "qwen3_next",
    }
)
MLX_LM_TENSOR = frozenset(
    {
        "deepseek_v2",
        "deepseek_v3",
        "deepseek_v32",
        "deepseek_v41",
        "exaone_moe",
        "glm4_moe",
        "glm4_moe_lite",
        "gpt_oss",
        "iquestloopcoder",
        "kimi_k25",
        "kimi_k3",
        "llama",
        "longcat_flash",
        "longcat_flash_ngram",
        "minimax",
        "minimax_m3_vl",
        "ministral3",
        "mistral4",
        "muse_spark",
        "qwen2",
        "qwen3",
        "qwen3_5",
        "qwen3_moe",
        "step3p5",
    }
)
# mlx-lm's MODEL_REMAPPING: config.json's model_type -> the model file that implements it.
MLX_LM_REMAPPING = {
    "mistral": "llama",
    "llava": "mistral3",
    "phi-msft": "phixtral",
    "falcon_mamba": "mamba",
    "joyai_llm_flash": "deepseek_v3",
    "kimi_k2": "deepseek_v3",
    "qwen2_5_vl": "qwen2_vl",
    "minimax_m2": "minimax",
    "iquestcoder": "llama",
    "xverse": "llama",
    "gemma4_unified": "gemma4",
    "deepseek_v41_text": "deepseek_v41",
}
# What vllmmlxd splits itself (the engine modules named in the docstring).
OWN_PIPELINE = frozenset({"llama"})
OWN_TENSOR = frozenset({"llama"})

PIPELINE = MLX_LM_PIPELINE | OWN_PIPELINE
TENSOR = MLX_LM_TENSOR | OWN_TENSOR


@dataclass(frozen=True)
class ModelShape:
    """The facts of a model's config.json a split depends on."""

    model_type: str
    layers: int
    heads: int
    kv_heads: int
    intermediate: int | None = None

    @property
    def family(self) -> str:
        return MLX_LM_REMAPPING.get(self.model_type, self.model_type)


def read_shape(config: dict) -> ModelShape:
    """The shape in a model's config.json (a VLM's text part, where it has one)."""
    text = config.get("text_config") or config
    heads = int(text.get("num_attention_heads") or 0)
    return ModelShape(
        model_type=str(config.get("model_type", "")),
        layers=int(text.get("num_hidden_layers") or 0),
        heads=heads,
        kv_heads=int(text.get("num_key_value_heads") or heads),
        intermediate=text.get("intermediate_size"),
    )


def folder_shape(folder: Path) -> ModelShape | None:
    """The shape of an MLX model folder, or None when it has no readable config.json."""
    try:
        return read_shape(json.loads((folder / "config.json").read_text()))
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def _names(families: frozenset[str]) -> str:
    return ", ".join(sorted(families))


def split_problem(shape: ModelShape, parallel: str, world: int) -> str | None:
    """Why ``shape`` cannot be split ``parallel`` over ``world`` ranks, or None when it can."""
    family = shape.family
    if parallel == "pipeline":
        if family not in PIPELINE:
            return (
                f"mlx-lm cannot split a {shape.model_type} model by pipeline; pipeline splits: {_names(PIPELINE)}"
                + (f"; use parallel: tensor ({shape.model_type} splits by tensor)" if family in TENSOR else "")
            )
        if shape.layers < world:
            return f"pipeline over {world} ranks needs at least as many layers ({shape.layers}) as ranks"
        return None
    if family not in TENSOR:
        return f"mlx-lm cannot split a {shape.model_type} model by tensor; tensor splits: {_names(TENSOR)}" + (
            f"; use parallel: pipeline ({shape.model_type} splits by pipeline)" if family in PIPELINE else ""
        )
    if family in OWN_TENSOR:
        # Heads go to ranks a key/value group at a time: each rank needs one group at least.
        if shape.kv_heads < world:
            return (
                f"tensor over {world} ranks needs at least one key/value head per rank "
                f"({shape.kv_heads} key/value heads): use fewer ranks or parallel: pipeline"
            )
    elif shape.heads % world or shape.kv_heads % world:
        return (
            f"tensor over {world} ranks needs the attention heads ({shape.heads}) and key/value heads "
            f"({shape.kv_heads}) to divide by {world}: use parallel: pipeline or another rank count"
        )
    if shape.intermediate and shape.intermediate % world:
        return f"tensor over {world} ranks needs the MLP width ({shape.intermediate}) to divide by {world}"
    return None


def layer_share(layers: int, world: int, rank: int) -> tuple[int, int]:
    """The layers [start, end) rank ``rank`` runs in a pipeline (mlx-lm's rule in models/pipeline.py):
    an even split with the extra layers on the low ranks, and rank 0 holding the last layers."""
    per, extra = divmod(layers, world)
    sizes = [per + (1 if r < extra else 0) for r in range(world)]
    end = layers - sum(sizes[:rank])
    return end - sizes[rank], end


def kv_group_share(kv_heads: int, world: int, rank: int) -> tuple[int, int]:
    """The key/value heads [start, end) rank ``rank`` holds in vllmmlxd's tensor split of llama:
    as even as whole groups allow, the extra ones on the low ranks."""
    per, extra = divmod(kv_heads, world)
    start = rank * per + min(rank, extra)
    return start, start + per + (1 if rank < extra else 0)
