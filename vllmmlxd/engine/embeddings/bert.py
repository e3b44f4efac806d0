"""A BERT encoder in MLX, for sentence-transformers embedding models (all-MiniLM-L6-v2 and kin).

Written here rather than taken from ``mlx-embeddings`` (GPL-3.0): the forward pass is
small. Token, position and segment embeddings, then post-norm encoder layers (self
attention, GELU MLP, each added back and layer-normed), then the sentence-transformers
pooling the folder's ``1_Pooling/config.json`` names and, when ``modules.json`` lists a
Normalize module, L2 normalisation. Padded rows are masked out of attention and pooling,
so a batch of inputs of different lengths gives each the vector it would get alone.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import mlx.core as mx
import mlx.nn as nn

BERT_TYPES = ("bert",)  # model_type values this module runs
# Checkpoints saved from a task model (BertForMaskedLM...) prefix the encoder's weights.
_PREFIXES = ("bert.", "model.")
_UNUSED = ("pooler.", "cls.", "embeddings.position_ids")


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"

    @classmethod
    def from_dict(cls, data: dict) -> BertConfig:
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True)
class Pooling:
    """How token vectors become one sentence vector (sentence-transformers' pooling config)."""

    mode: str = "mean"  # mean, cls or max
    normalize: bool = True


def _config_of(folder: Path) -> dict:
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def is_bert_folder(folder: Path) -> bool:
    """True when ``folder``'s config.json describes a BERT encoder (an embedding model here)."""
    return _config_of(folder).get("model_type") in BERT_TYPES


def is_sequence_classifier(folder: Path) -> bool:
    """True when ``folder`` is a BERT with a classification head (``BertForSequenceClassification``):
    a cross-encoder, served as a reranker rather than as an embedding model."""
    config = _config_of(folder)
    architectures = config.get("architectures") or []
    return (
        config.get("model_type") in BERT_TYPES
        and isinstance(architectures, list)
        and any(str(a).endswith("ForSequenceClassification") for a in architectures)
    )


def read_pooling(folder: Path) -> Pooling:
    """The folder's pooling; a plain BERT folder without sentence-transformers files gets mean + L2."""
    mode = "mean"
    try:
        pool = json.loads((folder / "1_Pooling" / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        pool = {}
    if pool.get("pooling_mode_cls_token"):
        mode = "cls"
    elif pool.get("pooling_mode_max_tokens"):
        mode = "max"
    elif pool and not pool.get("pooling_mode_mean_tokens"):
        raise ValueError(f"unsupported pooling in {folder / '1_Pooling' / 'config.json'}: only mean, cls and max are")
    try:
        modules = json.loads((folder / "modules.json").read_text(encoding="utf-8"))
        normalize = any(str(m.get("type", "")).endswith("Normalize") for m in modules)
    except (OSError, ValueError, AttributeError):
        normalize = True  # cosine similarity is what embeddings are used for: unit vectors are the safe default
    return Pooling(mode, normalize)


class _Embeddings(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden_size)
        self.position_embeddings = nn.Embedding(c.max_position_embeddings, c.hidden_size)
        self.token_type_embeddings = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def __call__(self, ids: mx.array, types: mx.array | None = None) -> mx.array:
        positions = mx.arange(ids.shape[1])
        # One segment (an embedding input): every token has type 0; a cross-encoder's pair has two.
        segment = self.token_type_embeddings.weight[0] if types is None else self.token_type_embeddings(types)
        x = self.word_embeddings(ids) + self.position_embeddings(positions) + segment
        return self.LayerNorm(x)


class _Dense(nn.Module):
    """A linear layer followed by layer norm of it plus the residual (BERT's post-norm)."""

    def __init__(self, c: BertConfig, dims_in: int):
        super().__init__()
        self.dense = nn.Linear(dims_in, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def __call__(self, x: mx.array, residual: mx.array) -> mx.array:
        return self.LayerNorm(self.dense(x) + residual)


class _SelfAttention(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.query = nn.Linear(c.hidden_size, c.hidden_size)
        self.key = nn.Linear(c.hidden_size, c.hidden_size)
        self.value = nn.Linear(c.hidden_size, c.hidden_size)


class _Attention(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.heads = c.num_attention_heads
        self.self = _SelfAttention(c)
        self.output = _Dense(c, c.hidden_size)

    def __call__(self, x: mx.array, mask: mx.array) -> mx.array:
        b, n, d = x.shape

        def split(t: mx.array) -> mx.array:
            return t.reshape(b, n, self.heads, d // self.heads).transpose(0, 2, 1, 3)

        q, k, v = split(self.self.query(x)), split(self.self.key(x)), split(self.self.value(x))
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=1 / math.sqrt(d // self.heads), mask=mask)
        return self.output(out.transpose(0, 2, 1, 3).reshape(b, n, d), x)


class _Intermediate(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.intermediate_size)


class _Layer(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.attention = _Attention(c)
        self.intermediate = _Intermediate(c)
        self.output = _Dense(c, c.intermediate_size)
        # BERT's "gelu" is the exact (erf) one; "gelu_new"/"gelu_pytorch_tanh" the tanh approximation.
        self.act = nn.gelu if c.hidden_act == "gelu" else nn.gelu_approx

    def __call__(self, x: mx.array, mask: mx.array) -> mx.array:
        x = self.attention(x, mask)
        return self.output(self.act(self.intermediate.dense(x)), x)


class _Encoder(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.layer = [_Layer(c) for _ in range(c.num_hidden_layers)]


class BertEncoder(nn.Module):
    """Token ids and an attention mask in, one (optionally unit) vector per row out."""

    def __init__(self, config: BertConfig, pooling: Pooling = Pooling()):
        super().__init__()
        self.config = config
        self.pooling = pooling
        self.embeddings = _Embeddings(config)
        self.encoder = _Encoder(config)

    def __call__(self, ids: mx.array, lengths: mx.array) -> mx.array:
        """``ids``: (batch, padded length) int32; ``lengths``: each row's real length."""
        x, valid = self.hidden(ids, lengths)
        return self.pool(x, valid)

    def hidden(self, ids: mx.array, lengths: mx.array, types: mx.array | None = None) -> tuple[mx.array, mx.array]:
        """The last layer's token vectors and the mask of real (unpadded) positions; ``types``:
        each token's segment (0 everywhere when None)."""
        valid = mx.arange(ids.shape[1])[None, :] < lengths[:, None]  # (batch, n)
        # Keys past a row's length get no attention; the padded queries' outputs are never read.
        mask = mx.where(valid, 0.0, -math.inf)[:, None, None, :].astype(mx.float32)
        x = self.embeddings(ids, types)
        for layer in self.encoder.layer:
            x = layer(x, mask)
        return x, valid

    def pool(self, x: mx.array, valid: mx.array) -> mx.array:
        keep = valid[..., None].astype(x.dtype)
        if self.pooling.mode == "cls":
            out = x[:, 0]
        elif self.pooling.mode == "max":
            out = mx.where(valid[..., None], x, -math.inf).max(axis=1)
        else:
            out = (x * keep).sum(axis=1) / mx.maximum(keep.sum(axis=1), 1e-9)
        if self.pooling.normalize:
            out = out / mx.maximum(mx.linalg.norm(out, axis=-1, keepdims=True), 1e-12)
        return out


def load_bert(folder: Path) -> BertEncoder:
    """The encoder of a BERT folder (config.json, *.safetensors, sentence-transformers pooling), in float32."""
    config = BertConfig.from_dict(json.loads((folder / "config.json").read_text(encoding="utf-8")))
    model = BertEncoder(config, read_pooling(folder))
    model.load_weights(list(read_weights(folder, _UNUSED).items()), strict=True)
    mx.eval(model.parameters())
    return model


def read_weights(folder: Path, unused: tuple[str, ...]) -> dict[str, mx.array]:
    """The folder's safetensors as float32 arrays by name, the encoder's prefix taken off,
    the names starting with one of ``unused`` left out."""
    weights: dict[str, mx.array] = {}
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {folder}")
    for path in files:
        # A safetensors file loads as a dict of arrays; mlx types every form load can return as one union.
        for name, value in cast(dict[str, mx.array], mx.load(str(path))).items():
            for prefix in _PREFIXES:
                if name.startswith(prefix):
                    name = name[len(prefix) :]
                    break
            if name.startswith(unused):
                continue
            # float32 throughout: MLX's CPU half-precision matmul is slow, and the model is small.
            weights[name] = value.astype(mx.float32)
    return weights
