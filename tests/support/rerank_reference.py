"""An independent reference forward of a BERT cross-encoder in numpy, one pair at a time: no
batch, no padding, no mask, nothing of the engine's code. Read from the folder's safetensors
as a transformers checkpoint names them (``bert.`` prefix, ``classifier``), with the pair made
by the tokenizer's own template (``Tokenizer.encode(query, document)``)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import cast

import mlx.core as mx
import numpy as np
from tokenizers import Tokenizer

_erf = np.vectorize(math.erf)


def _weights(folder: Path) -> dict[str, np.ndarray]:
    arrays = cast(dict[str, mx.array], mx.load(str(folder / "model.safetensors")))
    return {k: np.array(v.astype(mx.float32), dtype=np.float64) for k, v in arrays.items()}


def _norm(x: np.ndarray, w: dict, name: str, eps: float) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w[f"{name}.weight"] + w[f"{name}.bias"]


def _linear(x: np.ndarray, w: dict, name: str) -> np.ndarray:
    return x @ w[f"{name}.weight"].T + w[f"{name}.bias"]


class ReferenceCrossEncoder:
    def __init__(self, folder: Path):
        self.config = json.loads((folder / "config.json").read_text())
        self.w = _weights(folder)
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()

    def pair(self, query: str, document: str) -> tuple[list[int], list[int]]:
        """The tokenizer's own pair encoding: ids and segment ids."""
        e = self.tokenizer.encode(query, document)
        return e.ids, e.type_ids

    def logit(self, ids: list[int], types: list[int]) -> float:
        c, w = self.config, self.w
        eps, heads = c["layer_norm_eps"], c["num_attention_heads"]
        p = "bert."
        x = (
            w[p + "embeddings.word_embeddings.weight"][ids]
            + w[p + "embeddings.position_embeddings.weight"][np.arange(len(ids))]
            + w[p + "embeddings.token_type_embeddings.weight"][types]
        )
        x = _norm(x, w, p + "embeddings.LayerNorm", eps)
        n, d = x.shape
        for i in range(c["num_hidden_layers"]):
            lp = f"{p}encoder.layer.{i}."
            q, k, v = (
                _linear(x, w, lp + f"attention.self.{m}").reshape(n, heads, d // heads).transpose(1, 0, 2)
                for m in ("query", "key", "value")
            )
            scores = q @ k.transpose(0, 2, 1) / math.sqrt(d // heads)
            probs = np.exp(scores - scores.max(-1, keepdims=True))
            probs /= probs.sum(-1, keepdims=True)
            attended = (probs @ v).transpose(1, 0, 2).reshape(n, d)
            x = _norm(
                _linear(attended, w, lp + "attention.output.dense") + x, w, lp + "attention.output.LayerNorm", eps
            )
            inner = _linear(x, w, lp + "intermediate.dense")
            inner = 0.5 * inner * (1 + _erf(inner / math.sqrt(2)))
            x = _norm(_linear(inner, w, lp + "output.dense") + x, w, lp + "output.LayerNorm", eps)
        pooled = np.tanh(_linear(x[0], w, p + "pooler.dense"))
        return float(_linear(pooled, w, "classifier")[0])

    def score(self, query: str, document: str, max_tokens: int | None = None) -> float:
        """sigmoid of the logit of one pair; ``max_tokens``: cut the document's end to fit, as the server does."""
        ids, types = self.pair(query, document)
        if max_tokens is not None and len(ids) > max_tokens:
            ids, types = ids[: max_tokens - 1] + ids[-1:], types[: max_tokens - 1] + types[-1:]
        return 1 / (1 + math.exp(-self.logit(ids, types)))
