"""Tiny random-weight models of the families people run, built with mlx-lm's own model classes.

Each family is a config small enough to run a forward pass in about a millisecond on a CPU,
and shaped like the real thing where the engine can tell: which layers are full attention,
sliding windows (a window shorter than the test prompts) or recurrent state; experts; latent
attention. ``build`` makes one in float32 or at 4 bits with bfloat16 activations (mlx-lm's
quantization, as a community conversion is); ``save`` writes it as a model folder mlx-lm
loads, with builtin:tiny's tokenizer when a test serves it through the API.

Random weights give near-ties between the top two tokens; the output layer is scaled
(``HEAD_SCALE``) so most of a reference's margins are wide, and the fidelity harness states
how it treats the rest (tests/support/fidelity.py).
"""

from __future__ import annotations

import copy
import json
import shutil
from functools import cache
from pathlib import Path
from typing import Any, Literal

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.utils import _get_classes, quantize_model

Precision = Literal["float32", "q4"]
PRECISIONS: tuple[Precision, ...] = ("float32", "q4")
VOCAB = 512
WINDOW = 64  # the sliding-window families' window: shorter than the harness's prompts, wider than a block

_BASE: dict[str, Any] = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=128,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    max_position_embeddings=32768,
    tie_word_embeddings=False,
)
_HYBRID = dict(
    linear_num_value_heads=4,
    linear_num_key_heads=2,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_conv_kernel_dim=4,
    full_attention_interval=2,
)
# Qwen3.5's text model (inside a vision-language config, as its checkpoints ship).
_QWEN3_5 = dict(
    _BASE,
    **_HYBRID,
    num_hidden_layers=4,
    rope_parameters={"type": "default", "mrope_section": [1, 1, 0], "rope_theta": 10000, "partial_rotary_factor": 0.25},
)

# The config of each family (model_type: what mlx-lm builds it from), as tiny as its code allows.
FAMILIES: dict[str, dict[str, Any]] = {
    "llama": dict(_BASE, model_type="llama", num_hidden_layers=2),
    "qwen3": dict(_BASE, model_type="qwen3", num_hidden_layers=2),
    "phi3": dict(_BASE, model_type="phi3", num_hidden_layers=2),
    "qwen3_moe": dict(
        _BASE,
        model_type="qwen3_moe",
        num_hidden_layers=2,
        num_experts=4,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        moe_intermediate_size=64,
        norm_topk_prob=True,
    ),
    "glm4_moe": dict(
        _BASE,
        model_type="glm4_moe",
        num_hidden_layers=2,
        moe_intermediate_size=64,
        norm_topk_prob=True,
        n_group=1,
        topk_group=1,
        n_shared_experts=1,
        n_routed_experts=4,
        routed_scaling_factor=1.0,
        num_experts_per_tok=2,
        first_k_dense_replace=1,
        rope_scaling=None,
        use_qk_norm=True,
        attention_bias=False,
        partial_rotary_factor=0.5,
    ),
    "deepseek_v3": dict(
        _BASE,
        model_type="deepseek_v3",
        num_hidden_layers=2,
        moe_intermediate_size=64,
        n_shared_experts=1,
        n_routed_experts=4,
        num_experts_per_tok=2,
        kv_lora_rank=32,
        q_lora_rank=48,
        qk_rope_head_dim=8,
        v_head_dim=16,
        qk_nope_head_dim=16,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=1,
        moe_layer_freq=1,
    ),
    "gemma3_text": dict(
        _BASE,
        model_type="gemma3_text",
        num_hidden_layers=3,
        sliding_window=WINDOW,
        sliding_window_pattern=3,
        query_pre_attn_scalar=16,
        rope_local_base_freq=10000.0,
    ),
    "gemma4_text": dict(
        _BASE,
        model_type="gemma4_text",
        num_hidden_layers=4,
        global_head_dim=32,
        num_kv_shared_layers=1,
        vocab_size_per_layer_input=VOCAB,
        hidden_size_per_layer_input=16,
        sliding_window=WINDOW,
        sliding_window_pattern=2,
        tie_word_embeddings=True,
    ),
    "gpt_oss": dict(
        _BASE,
        model_type="gpt_oss",
        num_hidden_layers=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention"],
    ),
    "qwen3_next": dict(
        _BASE,
        **_HYBRID,
        model_type="qwen3_next",
        num_hidden_layers=4,
        num_experts=4,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        shared_expert_intermediate_size=64,
        mlp_only_layers=[],
        moe_intermediate_size=64,
        partial_rotary_factor=0.25,
    ),
    "qwen3_5": dict(
        model_type="qwen3_5", tie_word_embeddings=False, text_config=dict(_QWEN3_5, model_type="qwen3_5_text")
    ),
    "qwen3_5_moe": dict(
        model_type="qwen3_5_moe",
        tie_word_embeddings=False,
        text_config=dict(
            _QWEN3_5,
            model_type="qwen3_5_moe_text",
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=64,
            shared_expert_intermediate_size=64,
        ),
    ),
    "lfm2": dict(
        _BASE,
        model_type="lfm2",
        num_hidden_layers=3,
        norm_eps=1e-5,
        conv_bias=False,
        conv_L_cache=3,
        block_dim=64,
        block_multiple_of=16,
        block_ffn_dim_multiplier=1.0,
        block_auto_adjust_ff_dim=False,
        block_ff_dim=128,
        layer_types=["conv", "full_attention", "conv"],
    ),
    "nemotron_h": dict(
        _BASE,
        model_type="nemotron_h",
        num_hidden_layers=4,
        attention_bias=False,
        mamba_num_heads=4,
        mamba_head_dim=16,
        mamba_proj_bias=False,
        ssm_state_size=16,
        conv_kernel=4,
        n_groups=1,
        mlp_bias=False,
        layer_norm_epsilon=1e-5,
        use_bias=False,
        use_conv_bias=True,
        # Three Mamba-2 layers of four: what a row's state holds shows in the logits (a tie otherwise).
        hybrid_override_pattern=["M", "M", "M", "*"],
    ),
}
# The output layer's scale: wider margins between the top two tokens in float32 (gemma4's logits are
# soft-capped; lfm2's head is its embedding, and larger it makes the model repeat a few tokens).
HEAD_SCALE = {"gemma4_text": 1.0, "lfm2": 0.5}
DEFAULT_HEAD_SCALE = 8.0
GROUP_SIZE = 32  # the 4-bit families' quantization groups (64 would not divide every tiny layer)


def config_of(family: str, *, vocab: int = VOCAB, **sizes: Any) -> dict[str, Any]:
    """``family``'s config with ``vocab`` tokens and any ``sizes`` changed (a benchmark's larger model)."""
    config = copy.deepcopy(FAMILIES[family])
    inner = config.get("text_config", config)
    inner.update(sizes)
    inner["vocab_size"] = vocab
    if "vocab_size_per_layer_input" in inner:
        inner["vocab_size_per_layer_input"] = vocab
    return config


def make(
    family: str,
    precision: Precision,
    *,
    vocab: int = VOCAB,
    seed: int = 0,
    cycle: range | None = None,
    **sizes: Any,
) -> tuple[nn.Module, dict[str, Any]]:
    """A fresh model of ``family`` (weights drawn from ``seed``) and its config (with its quantization);
    ``cycle``: made predictable (``predictable``)."""
    config = config_of(family, vocab=vocab, **sizes)
    model_class, args_class = _get_classes(config)
    mx.random.seed(seed)
    model = model_class(args_class.from_dict(config))
    head = output_layer(model)
    head.weight = head.weight * HEAD_SCALE.get(family, DEFAULT_HEAD_SCALE)
    if cycle is not None:
        predictable(model, cycle)
    if precision == "q4":
        model.set_dtype(mx.bfloat16)
        model, config = quantize_model(model, config, GROUP_SIZE, 4)
    mx.eval(model.parameters())
    return model, config


LOUD = 1000.0  # a cycle token's embedding: the layers' random outputs are noise beside it


def predictable(model: nn.Module, cycle: range) -> None:
    """Make ``model``'s greedy answer known: after a token of ``cycle`` comes the next one of it
    (the last followed by the first), so a prompt that runs through the cycle is continued by
    repeating it. Each cycle token's embedding is one loud direction of its own, so the residual
    stream still points there after the layers (which compute as before, on random weights: the
    model costs what it did), and the head reads each direction as the next token. The model's
    hidden size bounds the cycle's length; a model whose head is its embedding cannot be made so."""
    embed = next(m for _, m in model.named_modules() if hasattr(m, "embed_tokens")).embed_tokens
    head = output_layer(model)
    if head is embed:
        raise ValueError("a tied head reads each token back as itself")
    size = int(embed.weight.shape[1])
    if len(cycle) > size:
        raise ValueError(f"a cycle of {len(cycle)} tokens needs a hidden size of at least that ({size})")
    ids = mx.array(list(cycle))
    directions = mx.eye(size)[: len(cycle)]
    embed.weight = embed.weight.at[ids].add(-embed.weight[ids] + LOUD * directions)
    following = mx.array([*list(cycle)[1:], cycle[0]])
    head.weight = mx.zeros_like(head.weight).at[following].add(directions)


def mtp_weights(model: nn.Module, precision: Precision, cycle: range | None = None) -> dict[str, mx.array]:
    """Random weights of one multi-token-prediction layer for ``model`` (a Qwen3.5 shape), by their
    names in the checkpoint less ``mtp.``. With ``cycle`` (a model made ``predictable``), the layer
    predicts what the model does: its projection passes the token's embedding on alone, loud."""
    from vllmmlxd.engine.speculation.mtp import MTPLayers, mtp_parts

    parts = mtp_parts(model)
    assert parts is not None, "a family with MTP layers of Qwen3.5's shape"
    mx.random.seed(1)
    layers = MTPLayers(parts.args, parts.layer)
    if cycle is not None:
        size = parts.args.hidden_size
        passing = mx.concatenate([mx.eye(size) * (LOUD / size**0.5), mx.zeros((size, size))], axis=1)
        layers.fc.weight = passing
    if precision == "q4":
        layers.set_dtype(mx.bfloat16)
        nn.quantize(layers, group_size=GROUP_SIZE, bits=4)
    mx.eval(layers.parameters())
    return dict(tree_flatten(layers.parameters()))


@cache
def build(family: str, precision: Precision) -> nn.Module:
    """``make``, once per process."""
    return make(family, precision)[0]


def output_layer(model: nn.Module) -> Any:
    """The layer whose rows are the logits: the head, or the tied embedding."""
    for owner in (model, getattr(model, "language_model", None)):
        head = getattr(owner, "lm_head", None) if owner is not None else None
        if head is not None:
            return head
    for _, module in model.named_modules():
        if hasattr(module, "embed_tokens"):
            return module.embed_tokens
    raise ValueError("no output layer")


def save(
    family: str,
    precision: Precision,
    dest: Path,
    *,
    tokenizer_from: Path | None = None,
    cycle: range | None = None,
    mtp: bool = False,
    **sizes: Any,
) -> Path:
    """``family`` as a model folder mlx-lm loads (config.json, model.safetensors and, from
    ``tokenizer_from``, a tokenizer whose size sets the vocabulary); made once."""
    if (dest / "config.json").exists():
        return dest
    vocab = VOCAB
    if tokenizer_from is not None:
        vocab = json.loads((tokenizer_from / "config.json").read_text())["vocab_size"]
    model, config = make(family, precision, vocab=vocab, cycle=cycle, **sizes)
    tmp = dest.with_name(dest.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    weights = dict(tree_flatten(model.parameters()))
    if mtp:  # the checkpoint's own multi-token-prediction layer, as Qwen3.5's ship it (mlx-lm drops it at load)
        weights.update({f"mtp.{k}": v for k, v in mtp_weights(model, precision, cycle).items()})
        config.get("text_config", config)["mtp_num_hidden_layers"] = 1
    mx.save_safetensors(str(tmp / "model.safetensors"), weights, metadata={"format": "mlx"})
    if tokenizer_from is not None:
        for name in ("tokenizer.json", "special_tokens_map.json", "generation_config.json"):
            if (tokenizer_from / name).exists():
                shutil.copy(tokenizer_from / name, tmp / name)
        tokenizer_config = json.loads((tokenizer_from / "tokenizer_config.json").read_text())
        tokenizer_config["model_max_length"] = _BASE["max_position_embeddings"]  # the family's context, not tiny's
        (tmp / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
        source = json.loads((tokenizer_from / "config.json").read_text())
        for key in ("eos_token_id", "bos_token_id"):
            if key in source:
                config[key] = source[key]
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    tmp.rename(dest)
    return dest
